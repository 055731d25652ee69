"""Autograd functions over trainer/model/triton_kernels.py: RMSNorm (also with a residual add before
it: AddRMSNorm), the q/k/v split with RoPE and SwiGLU as one fused kernel each way, with the
signatures of their torch-op forms in trainer.model.fused_ops (which calls these for CUDA tensors
when `usable`; RMSNorm also takes whether it runs in training, when its tiles may be timed); and
`cross_entropy_rows`, a chunk of the fused loss of trainer.model.linear_cross_entropy in one kernel.
Each saves the least its backward needs: RMSNorm its input (AddRMSNorm the sum) and one float per
row, SwiGLU its input (the sigmoid is recomputed), the q/k/v split nothing but the RoPE tables."""

from __future__ import annotations

import functools

import torch

from trainer.model import triton_kernels as tk
from trainer.model.kernel_tiles import Tile, TileTable, worth_timing

MAX_WARPS = 16
SWIGLU_BLOCK = 1024  # columns of one SwiGLU program
# tokens one q/k/v RoPE program moves (one head each), rows one RMSNorm-forward program takes,
# rows an RMSNorm-backward program takes per pass; the defaults run untimed (trainer.model.kernel_tiles)
TOO_BIG = (tk.OutOfResources,)  # a candidate this GPU cannot build is skipped, not fatal
ROPE_TILES = TileTable("qkv_rope", [Tile(n, 4) for n in (4, 8, 16, 32, 64)], Tile(32, 4), TOO_BIG)
RMS_FORWARD_TILES = TileTable(
    "rms_norm_forward", [Tile(1, 4), Tile(2, 4), Tile(4, 8), Tile(8, 8)], Tile(1, 4), TOO_BIG
)
RMS_BACKWARD_TILES = TileTable(
    "rms_norm_backward", [Tile(1, 4), Tile(2, 4), Tile(4, 8), Tile(8, 8), Tile(16, 16)], Tile(1, 4), TOO_BIG
)
MAX_TILE_ELEMENTS = 16384  # a tile's values, so a program's registers hold it
# vocabulary entries a cross-entropy program (one row) reads at a time; the small ones are for small
# vocabularies (the byte tokenizer's 258): a tile is never wider than the row padded to a power of two
CROSS_ENTROPY_TILES = TileTable(
    "cross_entropy",
    [
        Tile(n, w, "columns")
        for n, w in ((256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 16), (8192, 16), (16384, 32))
    ],
    Tile(4096, 16, "columns"),
    TOO_BIG,
)


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the Triton kernels take these tensors: CUDA tensors, and Triton is there."""
    return tk.available() and all(t.is_cuda for t in tensors)


def _warps(block: int) -> int:
    """Warps for a program of `block` columns: about 256 columns each, from 4 to MAX_WARPS."""
    return max(4, min(MAX_WARPS, block // 256))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as (rows, last axis) with a contiguous last axis (a copy only when it is not)."""
    t2 = t if t.dim() == 2 else t.reshape(-1, t.shape[-1])  # no view of what is rows already
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _programs(t: torch.Tensor, rows: int) -> int:
    """How many programs share RMSNorm's backward: a few per SM, each summing its rows' dw."""
    sms = torch.cuda.get_device_properties(t.device).multi_processor_count if t.is_cuda else 4
    return max(1, min(rows, 4 * sms))


def _norm_forward(
    x2: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    y: torch.Tensor,
    training: bool,
    add: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Writes RMSNorm(x2) * weight into y (x2's shape, contiguous) and returns rstd; x2 (rows, d).
    add = (h2, s2): the residual sum s2 = x2 + h2 is written and normalised, in the same kernel.
    `training`: the forward of a training step (which may time its tiles), not inference."""
    rows, d = x2.shape
    h2, s2 = add if add is not None else (x2, x2)
    rstd = torch.empty(rows, dtype=torch.float32, device=x2.device)
    block = tk.block_size(d)

    def launch(tile: Tile) -> None:
        tk.rms_norm_forward_kernel[(-(-rows // tile.rows),)](
            x2, h2, s2, weight, y, rstd, x2.stride(0), h2.stride(0), s2.stride(0), d, rows, d, eps,
            ADD=add is not None, ROWS=tile.rows, BLOCK=block, num_warps=max(tile.warps, _warps(block)),
        )  # fmt: skip

    key = (rows, d, x2.dtype, None if add is None else h2.dtype, y.dtype, x2.device)
    launch(RMS_FORWARD_TILES.pick(key, launch, x2, rows * d, training, (MAX_TILE_ELEMENTS, block)))
    return rstd


def _norm_backward(
    grad: torch.Tensor,
    saved: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shape: torch.Size,
    ds: torch.Tensor | None = None,
    h_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dh, dw) from y's gradient; `saved`: (the normalised input as rows, weight, rstd). With ds, the
    residual sum's own gradient, dx is the sum's whole gradient and dh the same values in h_dtype
    (dx itself where that is x's dtype: autograd's add gives both its inputs one tensor too)."""
    s2, weight, rstd = saved
    g2 = _rows(grad)
    rows, d = s2.shape
    dx = torch.empty(shape, dtype=s2.dtype, device=s2.device)
    split = ds is not None and h_dtype != s2.dtype
    dh = torch.empty(shape, dtype=h_dtype, device=s2.device) if split else dx
    ds2 = g2 if ds is None else _rows(ds)
    programs = _programs(s2, rows)
    per_program = -(-rows // programs)
    programs = -(-rows // per_program)
    parts = torch.empty(programs, d, dtype=torch.float32, device=s2.device)
    block = tk.block_size(d)

    def launch(tile: Tile) -> None:
        tk.rms_norm_backward_kernel[(programs,)](
            g2, s2, weight, rstd, dx, parts, ds2, dh,
            g2.stride(0), s2.stride(0), d, ds2.stride(0), d, rows, d, ADD=ds is not None, SPLIT=split,
            ROWS_PER_PROGRAM=per_program, TILE=tile.rows, BLOCK=block, num_warps=tile.warps,
        )  # fmt: skip

    key = (rows, d, g2.dtype, s2.dtype, None if ds is None else (ds2.dtype, h_dtype), dx.device)
    launch(RMS_BACKWARD_TILES.pick(key, launch, s2, rows * d, True, (MAX_TILE_ELEMENTS, block)))
    return dx, dh, parts.sum(0).to(weight.dtype)


class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out_dtype: torch.dtype,
        training: bool,
    ) -> torch.Tensor:
        """`training`: the forward of a training step (which may time its tiles), not inference."""
        x2 = _rows(x)
        y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        rstd = _norm_forward(x2, weight, eps, y, training)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = x.shape  # type: ignore[attr-defined]
        return y

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        dx, _, dw = _norm_backward(grad, ctx.saved_tensors, ctx.shape)  # type: ignore[attr-defined]
        return dx, dw, None, None, None


def add_rms_norm(
    x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype, training: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s, y, rstd, s as rows): the residual sum s = x + h (x's dtype), y = RMSNorm(s) * weight in
    out_dtype, from one kernel; AddRMSNorm's forward, and the whole of it without a gradient."""
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    s2 = s.view(-1, x.shape[-1])
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rstd = _norm_forward(_rows(x), weight, eps, y, training, add=(_rows(h), s2))
    return s, y, rstd, s2


class AddRMSNorm(torch.autograd.Function):
    """(s, RMSNorm(s)) of the residual sum s = x + h (x's dtype; h may be narrower, as a bf16
    branch's output beside the float32 residual): the add inside the norm's kernel, and in its
    backward s's own gradient added to the norm's (one pass over the residual each way, where the
    add, the sum of its gradients and their cast take three more)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        h: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s, y, rstd, s2 = add_rms_norm(x, h, weight, eps, out_dtype, training=True)
        ctx.save_for_backward(s2, weight, rstd)  # s's rows: saving s itself, an output, costs two ops
        ctx.shape, ctx.h_dtype = x.shape, h.dtype  # type: ignore[attr-defined]
        return s, y

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, ds: torch.Tensor, dy: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        shape, h_dtype = ctx.shape, ctx.h_dtype  # type: ignore[attr-defined]
        dx, dh, dw = _norm_backward(dy, ctx.saved_tensors, shape, ds, h_dtype)  # type: ignore[attr-defined]
        return dx, dh, dw, None, None


def swiglu_forward(h: torch.Tensor) -> torch.Tensor:
    h2 = _rows(h)
    rows, f = h2.shape[0], h2.shape[1] // 2
    y = torch.empty(*h.shape[:-1], f, dtype=h.dtype, device=h.device)  # contiguous: row stride f
    block = min(SWIGLU_BLOCK, tk.block_size(f))
    grid = (rows, -(-f // block))
    tk.swiglu_forward_kernel[grid](h2, y, h2.stride(0), f, f, BLOCK=block, num_warps=_warps(block))
    return y


class SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        return swiglu_forward(h)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors  # type: ignore[attr-defined]
        h2, g2 = _rows(h), _rows(grad)
        rows, f = g2.shape
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)  # contiguous: row stride 2 f
        block = min(SWIGLU_BLOCK, tk.block_size(f))
        tk.swiglu_backward_kernel[(rows, -(-f // block))](
            g2, h2, dh, g2.stride(0), h2.stride(0), 2 * f, f, BLOCK=block, num_warps=_warps(block)
        )
        return dh


def cross_entropy_rows(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    scale: torch.Tensor,
    argmax: torch.Tensor,
    grad: torch.Tensor | None,
) -> torch.Tensor:
    """The cross-entropy of each row of logits (rows, V) (float32; 0 where the target is
    ignore_index), each row's argmax written into `argmax` (rows,) int64, and when `grad` (rows, V)
    is given the logits' gradient, (softmax - one-hot) * scale (a 0-dim float32 tensor; 0 on ignored
    rows), written into it; `grad` may be the logits themselves (the training step's chunks write it
    in place). One kernel for the whole loss of a chunk of rows."""
    rows, vocab = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    out = logits if grad is None else grad  # not written without a gradient
    if logits.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("cross_entropy_rows needs its logits and gradient with a contiguous last axis")

    def launch_into(dlogits: torch.Tensor, tile: Tile) -> None:
        tk.cross_entropy_kernel[(rows,)](
            logits, targets, scale, loss, argmax, dlogits, logits.stride(0), dlogits.stride(0), ignore_index,
            V=vocab, GRAD=grad is not None, BLOCK=tile.rows, num_warps=tile.warps,
        )  # fmt: skip

    key = (vocab, logits.dtype, out.dtype, logits.device)  # the same for a step's last, shorter chunk
    if (tile := CROSS_ENTROPY_TILES.known(key)) is None:
        fitting = CROSS_ENTROPY_TILES.fitting(tk.block_size(vocab), 1)  # no block past the padded row
        timed = worth_timing(logits, rows * vocab, grad is not None)
        # timed candidates write their gradient apart: in place, the second would read the first's
        scratch = torch.empty_like(out) if CROSS_ENTROPY_TILES.will_time(key, timed) else out
        tile = CROSS_ENTROPY_TILES.choose(key, functools.partial(launch_into, scratch), timed, fitting)
        del scratch  # before the launch in place: the chunk's memory bound holds
    launch_into(out, tile)
    return loss


def _move_qkv(
    packed: torch.Tensor,
    parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    tables: tuple[torch.Tensor, torch.Tensor],
    heads: tuple[int, int],
    to_parts: bool,
    training: bool,
) -> None:
    """Between `packed` (B, T, H + 2 KV, hd), the fused projection's layout, and the parts q (B, H,
    T, hd), k and v (B, KV, T, hd): into the parts, q and k turned by RoPE (tables: cos, sin (T,
    n_rot) float32), when to_parts; else back into packed, turned back (the backward). One launch;
    a training launch may time its tiles (trainer.model.kernel_tiles)."""
    H, KV = heads
    B, T, _, hd = packed.shape
    cos, sin = tables
    n_rot = cos.shape[-1]
    block = tk.block_size(hd)
    rows = B * T
    strides = (_bth(packed, False), *(_bth(part, True) for part in parts))

    def launch(tile: Tile) -> None:
        per_program = max(1, min(tile.rows, tk.block_size(rows)))  # tokens a program moves
        tk.qkv_rope_kernel[(-(-rows // per_program), H + 2 * KV)](
            packed, *parts, cos, sin, *strides[0], *strides[1], *strides[2], *strides[3],
            rows, T, hd, n_rot, H, KV, 1.0 if to_parts else -1.0,
            TO_PARTS=to_parts, BLOCK=block, ROWS=per_program, num_warps=tile.warps,
        )  # fmt: skip

    key = (B, T, heads, hd, n_rot, strides, packed.dtype, parts[0].dtype, to_parts, packed.device)
    elements = rows * (H + 2 * KV) * hd
    launch(ROPE_TILES.pick(key, launch, packed, elements, training, (MAX_TILE_ELEMENTS // 2, block)))


def _bth(t: torch.Tensor, heads_first: bool) -> tuple[int, int, int]:
    """t's (batch, token, head) strides: t is (B, H, T, hd) when heads_first, else (B, T, H, hd)."""
    return (t.stride(0), t.stride(2), t.stride(1)) if heads_first else (t.stride(0), t.stride(1), t.stride(2))


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def split_qkv(
    qkv: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor],
    heads: tuple[int, int],
    attn_dtype: torch.dtype,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, T, hd), k and v (B, KV, T, hd), contiguous, in attn_dtype, q and k turned by RoPE,
    from the fused projection's (B, T, H + 2 KV, hd) output."""
    qkv = _last_contiguous(qkv)
    H, KV = heads
    B, T, _, hd = qkv.shape
    q = torch.empty(B, H, T, hd, dtype=attn_dtype, device=qkv.device)
    k, v = (torch.empty(B, KV, T, hd, dtype=attn_dtype, device=qkv.device) for _ in range(2))
    _move_qkv(qkv, (q, k, v), tables, heads, to_parts=True, training=training)
    return q, k, v


class QKV(torch.autograd.Function):
    """split_qkv with its backward: the three gradients written, turned back, into one tensor."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        heads: tuple[int, int],
        attn_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(cos, sin)
        ctx.heads, ctx.in_dtype = heads, qkv.dtype  # type: ignore[attr-defined]
        return split_qkv(qkv, (cos, sin), heads, attn_dtype, training=True)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        H, KV = ctx.heads  # type: ignore[attr-defined]
        B, _, T, hd = dq.shape
        grad = torch.empty(B, T, H + 2 * KV, hd, dtype=ctx.in_dtype, device=dq.device)  # type: ignore[attr-defined]
        # one kernel reads all three: one dtype (.to is a no-op where they agree, as SDPA's do)
        parts = (_last_contiguous(dq), _last_contiguous(dk.to(dq.dtype)), _last_contiguous(dv.to(dq.dtype)))
        _move_qkv(grad, parts, (cos, sin), (H, KV), to_parts=False, training=True)
        return grad, None, None, None, None


def decode_qkv(
    qkv: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor],
    heads: tuple[int, int],
    attn_dtype: torch.dtype,
    caches: tuple[torch.Tensor, torch.Tensor],
    position: torch.Tensor,
) -> torch.Tensor:
    """A decoding step's new token from the fused projection's output (B, 1, H + 2 KV, hd): q (B, H,
    1, hd) in attn_dtype, turned by RoPE, returned; k (turned) and v written into the KV caches (B,
    KV, ctx, hd) at `position` (a one-element device tensor: one CUDA graph serves every step).
    tables: rope_tables of that position's cos/sin rows. One kernel."""
    H, KV = heads
    B, T, _, hd = qkv.shape
    k_cache, v_cache = caches
    if T != 1 or k_cache.stride() != v_cache.stride() or qkv.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError("decode_qkv takes one token, and caches of one layout with contiguous rows")
    q = torch.empty(B, H, 1, hd, dtype=attn_dtype, device=qkv.device)
    cos, sin = tables
    tk.decode_qkv_kernel[(B, H + 2 * KV)](
        qkv, q, k_cache, v_cache, cos, sin, position, qkv.stride(0), qkv.stride(2), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), H, KV, hd, cos.shape[-1],
        BLOCK=tk.block_size(hd), num_warps=1,
    )  # fmt: skip
    return q


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (T, n_rot) float32 contiguous tables the kernel reads: the rope_cache rows themselves
    where they are that already (as a float32 model's are; no operation in every layer)."""
    if all(t.dim() == 2 and t.dtype == torch.float32 and t.is_contiguous() for t in (cos, sin)):
        return cos, sin
    n_rot = cos.shape[-1]
    return (
        cos.reshape(-1, n_rot).to(torch.float32).contiguous(),
        sin.reshape(-1, n_rot).to(torch.float32).contiguous(),
    )
