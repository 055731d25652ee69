"""The hand-written autograd functions of the model's eager path: RMSNorm (on CUDA with the residual
add before it), the q/k/v split with RoPE, SwiGLU (trainer/model/llama.py uses them). Autograd
through the plain ops of these makes several passes over the activations per op, where a
hand-written backward needs one or two; on a float32 CPU run they go one step further and call the fused
C kernels of trainer.model.cpu_kernels (one pass each), falling back to the torch ops below where
those are unavailable. On CUDA they call the fused Triton kernels of trainer.model.triton_ops where
Triton is installed (one pass each way). While compiling (torch.compiler.is_compiling()) every
function here returns plain ops, which inductor fuses itself.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from trainer.model import cpu_kernels

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64 (numerics checks): torch ops


def triton_kernels_for(*tensors: torch.Tensor) -> ModuleType | None:
    """trainer.model.triton_ops when it takes these tensors (CUDA, not float64, not compiling);
    imported on the first CUDA call, so a CPU process never loads Triton."""
    if torch.compiler.is_compiling() or not all(t.is_cuda and t.dtype in TRITON_DTYPES for t in tensors):
        return None
    from trainer.model import triton_ops

    return triton_ops if triton_ops.usable(*tensors) else None


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the next matmul runs in: the autocast dtype when autocast is on, else x's."""
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight over the last axis, computed in float32 (float64 for float64 input) and
    returned in the dtype of the matmul that follows (bf16 under bf16 autocast), so the one cast
    happens here rather than once in every consuming linear (the same values: autocast would round
    the float32 result to bf16 there)."""
    out_dtype = compute_dtype(x)
    if torch.compiler.is_compiling():  # plain ops, fused by inductor
        xf, wf = _f32(x), _f32(weight)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * wf).to(out_dtype)
    if (fused := triton_kernels_for(x, weight)) is not None:
        training = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        return fused.RMSNorm.apply(x, weight, eps, out_dtype, training)
    kernel = out_dtype == torch.float32 and cpu_kernels.usable(x, weight)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _RMSNormKernel.apply(x, weight, eps) if kernel else _RMSNorm.apply(x, weight, eps, out_dtype)
    if kernel:
        return cpu_kernels.rms_norm_forward(x.contiguous(), weight, eps)[0]
    return _rms_norm(_f32(x), _f32(weight), eps)[0].to(out_dtype)  # no gradient: in-place ops are fine


def add_rms_norm(
    x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, rms_norm(x + h, weight, eps)): a residual add and the norm that reads the sum, in
    one Triton kernel each way on CUDA (triton_ops.AddRMSNorm: h, a branch's output, may be
    narrower than the residual x); elsewhere the add, then rms_norm."""
    fused = triton_kernels_for(x, h, weight)
    if fused is not None and x.shape == h.shape and _sums_in(x.dtype, h.dtype):
        if torch.is_grad_enabled() and (x.requires_grad or h.requires_grad or weight.requires_grad):
            return fused.AddRMSNorm.apply(x, h, weight, eps, compute_dtype(x))
        s, y, _, _ = fused.add_rms_norm(x, h, weight, eps, compute_dtype(x), False)
        return s, y
    s = x + h
    return s, rms_norm(s, weight, eps)


def _sums_in(x_dtype: torch.dtype, h_dtype: torch.dtype) -> bool:
    """Whether x + h has x's dtype (asked without torch.promote_types, an operation of its own)."""
    return h_dtype == x_dtype or x_dtype == torch.float32 and h_dtype in (torch.bfloat16, torch.float16)


def _f32(t: torch.Tensor) -> torch.Tensor:
    """t in float32, or float64 when it is (the numerics checks run the model in float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _rms_norm(xf: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(xf / rms(xf) * weight, 1 / rms(xf)) of a float32 xf; the norm read in one pass."""
    rstd = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).pow_(2).div_(xf.shape[-1]).add_(eps).rsqrt_()
    return (xf * rstd).mul_(weight), rstd


class _RMSNorm(torch.autograd.Function):
    """RMSNorm with a hand-written backward: autograd through pow/mean/rsqrt/products makes about
    twice the passes over the activations."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        xf, wf = _f32(x), _f32(weight)
        y, rstd = _rms_norm(xf, wf, eps)
        ctx.save_for_backward(xf, wf, rstd)
        ctx.dtypes = (x.dtype, weight.dtype)  # type: ignore[attr-defined]
        return y.to(out_dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        xf, wf, rstd = ctx.saved_tensors  # type: ignore[attr-defined]
        x_dtype, w_dtype = ctx.dtypes  # type: ignore[attr-defined]
        g = grad.to(xf.dtype)
        xhat = xf * rstd
        dw = (g * xhat).sum(dim=tuple(range(g.dim() - 1)))
        gw = g * wf
        # d/dx of xhat * w: rstd * (gw - xhat * mean(gw * xhat))
        dot = (gw * xhat).mean(-1, keepdim=True)
        dx = torch.addcmul(gw, xhat, dot, value=-1).mul_(rstd)
        return dx.to(x_dtype), dw.to(w_dtype), None, None


class _RMSNormKernel(torch.autograd.Function):
    """_RMSNorm in one pass each way (float32 CPU tensors: trainer.model.cpu_kernels)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        x = x.contiguous()
        y, rstd = cpu_kernels.rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors  # type: ignore[attr-defined]
        return (*cpu_kernels.rms_norm_backward(grad, x, weight, rstd), None)


def _rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x * cos + rotate_half(x) * sin` over the first n_rot = cos.shape[-1] dims of x (the rest
    pass through), computed in float32 (float64 for float64 input), returned as out_dtype, or
    written into `out` (any strides: the attention writes heads-first tensors through transposed
    views). cos/sin are rope_cache tables shaped to broadcast against x[..., :n_rot]. Pass -sin to
    turn the other way (RoPE's backward)."""
    n_rot = cos.shape[-1]
    half = n_rot // 2
    # rope_cache repeats its frequencies, so one half of each table is all of it
    c, s = cos[..., :half], sin[..., :half]
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    x1, x2 = xf[..., :half], xf[..., half:n_rot]
    if torch.compiler.is_compiling():  # inductor fuses the plain form (and lowers no out= ops)
        r = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, xf[..., n_rot:]), dim=-1)
        return r.to(out_dtype) if out is None else out.copy_(r)
    # (x1, x2) -> (x1 c - x2 s, x2 c + x1 s): four half-width products written in place, no
    # rotated copy of x
    rotated = (
        torch.empty(x.shape, dtype=xf.dtype, device=x.device) if out is None or xf.dtype != out.dtype else out
    )
    o1, o2 = rotated[..., :half], rotated[..., half:n_rot]
    torch.mul(x1, c, out=o1)
    o1.addcmul_(x2, s, value=-1)
    torch.mul(x2, c, out=o2)
    o2.addcmul_(x1, s)
    if n_rot < x.shape[-1]:
        rotated[..., n_rot:] = xf[..., n_rot:]
    if out is not None:
        if rotated is not out:
            out.copy_(rotated)
        return out
    return rotated.to(out_dtype)


class _RoPE(torch.autograd.Function):
    """RoPE with a hand-written backward (the gradient turned back by the same angles): autograd
    through the slices, casts and products of the forward costs several times the forward."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.in_dtype = x.dtype  # type: ignore[attr-defined]
        return _rotate(x, cos, sin, out_dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        return _rotate(grad, cos, -sin, ctx.in_dtype), None, None, None  # type: ignore[attr-defined]


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Rotates the first n_rot dims of x's last axis (the rest pass through) in float32 and returns
    out_dtype (default: x's dtype). cos/sin: rope_cache tables (T, n_rot), or views of them that
    broadcast against x[..., :n_rot] for other layouts: x (B, H, T, hd) takes (T, n_rot) as they
    are, x (B, T, H, hd) takes them unsqueezed to (T, 1, n_rot)."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if torch.is_grad_enabled() and x.requires_grad and not torch.compiler.is_compiling():
        return _RoPE.apply(x, cos, sin, out_dtype)
    return _rotate(x, cos, sin, out_dtype)  # inference, tracing and export: plain tensor ops


def _heads_first(B: int, T: int, heads: int, hd: int, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A (B, heads, T, hd) tensor, returned as its (B, T, heads, hd) view for writing."""
    return torch.empty(B, heads, T, hd, dtype=dtype, device=like.device).transpose(1, 2)


class _QKV(torch.autograd.Function):
    """The fused q/k/v projection's output (B, T, H + 2 KV, hd) -> q (B, H, T, hd) and k, v
    (B, KV, T, hd), contiguous as SDPA takes them, q and k rotated. The backward writes the three
    gradients straight into one (B, T, H + 2 KV, hd) tensor: autograd's split and transposes would
    copy each gradient twice more (their backward is a concatenation)."""

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
        ctx.heads = heads  # type: ignore[attr-defined]
        ctx.in_dtype = qkv.dtype  # type: ignore[attr-defined]
        return _split_qkv(qkv, cos, sin, heads, attn_dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        H, KV = ctx.heads  # type: ignore[attr-defined]
        B, _, T, hd = dq.shape
        grad = torch.empty(B, T, H + 2 * KV, hd, dtype=ctx.in_dtype, device=dq.device)  # type: ignore[attr-defined]
        _rotate(dq.transpose(1, 2), cos, -sin, grad.dtype, out=grad[:, :, :H])
        _rotate(dk.transpose(1, 2), cos, -sin, grad.dtype, out=grad[:, :, H : H + KV])
        grad[:, :, H + KV :] = dv.transpose(1, 2)
        return grad, None, None, None, None


def _split_qkv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: tuple[int, int], attn_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    H, KV = heads
    B, T, _, hd = qkv.shape
    q = _rotate(qkv[:, :, :H], cos, sin, attn_dtype, out=_heads_first(B, T, H, hd, qkv, attn_dtype))
    k = _rotate(qkv[:, :, H : H + KV], cos, sin, attn_dtype, out=_heads_first(B, T, KV, hd, qkv, attn_dtype))
    v = _heads_first(B, T, KV, hd, qkv, attn_dtype)
    v.copy_(qkv[:, :, H + KV :])
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def qkv_heads(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: tuple[int, int], attn_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v for SDPA from the fused projection's output (see _QKV); cos/sin: the (T, n_rot)
    rope_cache rows of its positions, as the kernels read them (the torch forms broadcast them
    over the heads themselves: no reshaping in every layer of a kernel step)."""
    if torch.compiler.is_compiling():  # plain ops: inductor fuses them and derives the backward
        H, KV = heads
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = (
            _rotate(t, c, s, attn_dtype).transpose(1, 2) for t in qkv[:, :, : H + KV].split((H, KV), dim=2)
        )
        return q, k, qkv[:, :, H + KV :].transpose(1, 2).to(attn_dtype)
    if (fused := triton_kernels_for(qkv)) is not None:
        tables = fused.rope_tables(cos, sin)
        if torch.is_grad_enabled() and qkv.requires_grad:
            return fused.QKV.apply(qkv, *tables, heads, attn_dtype)
        return fused.split_qkv(qkv, tables, heads, attn_dtype)
    if attn_dtype == torch.float32 and cpu_kernels.usable(qkv, cos, sin):
        tables = cos.contiguous(), sin.contiguous()
        if torch.is_grad_enabled() and qkv.requires_grad:
            return _QKVKernel.apply(qkv, *tables, heads)
        return cpu_kernels.qkv_forward(qkv.contiguous(), *tables, heads)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # (T, 1, n_rot): over (B, T, heads, hd)
    if torch.is_grad_enabled() and qkv.requires_grad:
        return _QKV.apply(qkv, c, s, heads, attn_dtype)
    return _split_qkv(qkv, c, s, heads, attn_dtype)


def decode_qkv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: tuple[int, int],
    attn_dtype: torch.dtype,
    caches: tuple[torch.Tensor, torch.Tensor],
    position: torch.Tensor,
) -> torch.Tensor:
    """A graphed decoding step's one new token: returns q for SDPA (B, H, 1, hd) and writes its k and
    v into the layer's KV caches (B, KV, ctx, hd) at `position`, a one-element device tensor (cos/sin:
    that position's (1, n_rot) rope_cache rows). On CUDA one Triton kernel (two RoPE launches and
    two index_copy calls fewer per layer in the graph)."""
    if (fused := triton_kernels_for(qkv)) is not None:
        return fused.decode_qkv(qkv, fused.rope_tables(cos, sin), heads, attn_dtype, caches, position)
    q, k, v = qkv_heads(qkv, cos, sin, heads, attn_dtype)
    for cache, new in zip(caches, (k, v), strict=True):
        cache.index_copy_(2, position, new.to(cache.dtype))
    return q


class _QKVKernel(torch.autograd.Function):
    """_QKV in one pass each way (float32 CPU tensors: trainer.model.cpu_kernels); cos/sin as (T, n_rot)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        heads: tuple[int, int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(cos, sin)
        return cpu_kernels.qkv_forward(qkv.contiguous(), cos, sin, heads)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        return cpu_kernels.qkv_backward(dq, dk, dv, cos, sin), None, None, None


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up from the fused w1/w3 projection's output (gate | up). Keeps silu(gate) for
    the backward, which writes both gradients into one tensor (autograd would concatenate them)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        act = F.silu(gate)
        ctx.save_for_backward(gate, up, act)
        return act * up

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        gate, up, act = ctx.saved_tensors  # type: ignore[attr-defined]
        dh = torch.empty(*grad.shape[:-1], 2 * grad.shape[-1], dtype=grad.dtype, device=grad.device)
        d_gate, d_up = dh.chunk(2, dim=-1)
        torch.mul(grad, act, out=d_up)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=d_gate)
        return dh


class _SwiGLUKernel(torch.autograd.Function):
    """_SwiGLU in one pass each way (float32 CPU tensors: trainer.model.cpu_kernels); keeps only h, the
    backward recomputes the sigmoid."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor) -> torch.Tensor:
        h = h.contiguous()
        ctx.save_for_backward(h)
        return cpu_kernels.swiglu_forward(h)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return cpu_kernels.swiglu_backward(grad, h)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up from h = [gate | up] on the last axis."""
    if (fused := triton_kernels_for(h)) is not None:
        return (
            fused.SwiGLU.apply(h) if torch.is_grad_enabled() and h.requires_grad else fused.swiglu_forward(h)
        )
    if not torch.compiler.is_compiling():
        kernel = cpu_kernels.usable(h)
        if torch.is_grad_enabled() and h.requires_grad:
            return _SwiGLUKernel.apply(h) if kernel else _SwiGLU.apply(h)
        if kernel:
            return cpu_kernels.swiglu_forward(h.contiguous())
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up
