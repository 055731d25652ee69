"""Fused Triton kernels for the element-wise ops of a CUDA step: RMSNorm, the q/k/v split with RoPE,
SwiGLU, the cross-entropy over the output projection's logits, and a graphed decoding step's new
token turned and written into the KV cache (issue 23). The eager CUDA step spends as long in these
ops' torch form (mul, copy_, addcmul_, silu_backward: each a pass over the activations) as in its
matmuls; each kernel here reads its inputs once (the cross-entropy twice) and writes its outputs
once, computing in float32 whatever the storage dtype.
trainer/model/triton_ops.py wraps them; trainer.model.fused_ops and .linear_cross_entropy pick them.

Triton is optional (the `gpu` extra; CUDA builds of torch bring it). Without it, or with
FROMSCRATCH_TRITON_KERNELS=0, or on a CPU, `available()` is False and the torch ops run. Under
Triton's interpreter (TRITON_INTERPRET=1) the same kernels run on CPU tensors: that is how the
tests check their numerics on a machine without a GPU.
"""

from __future__ import annotations

import functools
import os

try:
    import triton
    import triton.language as tl
    from triton.runtime.errors import OutOfResources
except ImportError:  # the CPU install has no Triton

    class OutOfResources(Exception):  # type: ignore[no-redef]  # never raised without Triton
        pass

    triton = None

DISABLE_ENV = "FROMSCRATCH_TRITON_KERNELS"  # "0": use torch ops on CUDA too


@functools.cache
def available() -> bool:
    return triton is not None and os.environ.get(DISABLE_ENV, "1") != "0"


def description() -> str:
    """What a CUDA run's element-wise ops run on, for its start-up output and checkpoints."""
    if available():
        kernels = "RMSNorm (with the residual add before it), RoPE + q/k/v split, SwiGLU, cross-entropy, "
        kernels += "decoding q/k/v"
        return f"Triton {triton.__version__} kernels ({kernels}; their tiles timed on the first step)"
    return "torch ops" + (f" ({DISABLE_ENV}=0)" if triton is not None else " (no Triton installed)")


def interpreted() -> bool:
    """Whether Triton runs its kernels in its interpreter (on CPU tensors): the tests' mode."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def block_size(n: int) -> int:
    """The power of two a row of n values is padded to (Triton's blocks are powers of two)."""
    return 1 << max(0, (n - 1).bit_length())


if triton is not None:

    @triton.jit
    def rms_norm_forward_kernel(
        X, H, S, W, Y, RSTD, stride_x, stride_h, stride_s, stride_y, n_rows, D, eps,
        ADD: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """ROWS rows: y = x * rstd * w in float32, stored as Y's dtype; rstd kept for the backward.
        ADD: x is first the residual sum x + h (float32), stored into S, and normalised."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        in_rows = rows < n_rows
        mask = in_rows[:, None] & (cols < D)[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if ADD:
            x += tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(S + rows[:, None] * stride_s + cols[None, :], x.to(S.dtype.element_ty), mask=mask)
        w = tl.load(W + cols, mask=cols < D, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd, mask=in_rows)
        y = (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty)
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=mask)

    @triton.jit
    def rms_norm_backward_kernel(
        G, X, W, RSTD, DX, DW_PARTS, DS, DH, stride_g, stride_x, stride_dx, stride_ds, stride_dh, n_rows, D,
        ADD: tl.constexpr, SPLIT: tl.constexpr,
        ROWS_PER_PROGRAM: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """A run of rows, TILE at a time: dx = rstd * (g w - xhat mean(g w xhat)) per row, and this
        program's share of dw = sum over rows of g xhat (summed over the programs by the caller).
        ADD (the norm of a residual sum s = x + h): dx also takes s's own gradient DS, and SPLIT
        stores it again, in h's dtype, into DH (h's gradient where h is of another dtype)."""
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        in_cols = cols < D
        w = tl.load(W + cols, mask=in_cols, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK,), dtype=tl.float32)
        first = pid * ROWS_PER_PROGRAM
        # a compile-time count (one kernel per batch shape); the last program's run may end early
        for offset in range(0, ROWS_PER_PROGRAM, TILE):
            rows = first + offset + tl.arange(0, TILE)
            in_rows = (rows < n_rows) & (offset + tl.arange(0, TILE) < ROWS_PER_PROGRAM)
            mask = in_rows[:, None] & in_cols[None, :]
            g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=in_rows, other=0.0)[:, None]
            xhat = x * rstd
            gw = g * w[None, :]
            dot = (tl.sum(gw * xhat, axis=1) / D)[:, None]
            dx = rstd * (gw - xhat * dot)
            if ADD:
                dx += tl.load(DS + rows[:, None] * stride_ds + cols[None, :], mask=mask, other=0.0).to(
                    tl.float32
                )
                if SPLIT:
                    tl.store(
                        DH + rows[:, None] * stride_dh + cols[None, :], dx.to(DH.dtype.element_ty), mask=mask
                    )
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            dw += tl.sum(g * xhat, axis=0)
        tl.store(DW_PARTS + pid * D + cols, dw, mask=in_cols)

    @triton.jit
    def swiglu_forward_kernel(H, Y, stride_h, stride_y, F, BLOCK: tl.constexpr):
        """y = silu(gate) * up for a block of one row of h = [gate | up]."""
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < F
        gate = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(H + row * stride_h + F + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def swiglu_backward_kernel(G, H, DH, stride_g, stride_h, stride_dh, F, BLOCK: tl.constexpr):
        """d gate = g up silu'(gate), d up = g silu(gate), the sigmoid recomputed from h."""
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < F
        g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(H + row * stride_h + F + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(gate)
        d_gate = g * up * s * (1.0 + gate * (1.0 - s))
        tl.store(DH + row * stride_dh + cols, d_gate.to(DH.dtype.element_ty), mask=mask)
        tl.store(DH + row * stride_dh + F + cols, (g * gate * s).to(DH.dtype.element_ty), mask=mask)

    @triton.jit
    def qkv_rope_kernel(
        PACKED, Q, K, V, COS, SIN, packed_b, packed_t, packed_h, q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h,
        rows, T, hd, n_rot, H, KV, sin_sign,
        TO_PARTS: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    ):  # fmt: skip
        """One head of ROWS tokens between the fused projection's layout PACKED (its H + 2 KV heads)
        and q, k or v (the head says which; each tensor's (batch, token, head) strides given, the
        last axis contiguous): into them when TO_PARTS, back into PACKED otherwise (the backward).
        q and k heads are turned by RoPE over their first n_rot dims, y = x cos + rotate_half(x)
        sin, sin_sign -1 turning back; v heads move as they are. cos/sin: (T, n_rot) tables. One
        launch for q, k and v: three per layer each way cost the host three launches."""
        bt = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # flat (batch, token) indices
        head = tl.program_id(1)
        b = bt // T
        t = bt % T
        cols = tl.arange(0, BLOCK)
        mask = (bt < rows)[:, None] & (cols < hd)[None, :]
        packed = PACKED + (b * packed_b + t * packed_t + head * packed_h)[:, None]
        if head < H:
            part = Q + (b * q_b + t * q_t + head * q_h)[:, None]
        elif head < H + KV:
            part = K + (b * k_b + t * k_t + (head - H) * k_h)[:, None]
        else:
            part = V + (b * v_b + t * v_t + (head - H - KV) * v_h)[:, None]
        if TO_PARTS:
            src, dst = packed, part
        else:
            src, dst = part, packed
        x = tl.load(src + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if head < H + KV:  # q and k: RoPE
            half = n_rot // 2
            rotated = mask & (cols < n_rot)[None, :]
            partner = tl.where(cols < half, cols + half, cols - half)
            x_partner = tl.load(src + partner[None, :], mask=rotated, other=0.0).to(tl.float32)
            sign = (tl.where(cols < half, -1.0, 1.0) * sin_sign)[None, :]
            table = (t * n_rot)[:, None] + cols[None, :]
            cos = tl.load(COS + table, mask=rotated, other=1.0)
            sin = tl.load(SIN + table, mask=rotated, other=0.0)
            x = x * cos + sign * x_partner * sin
        if TO_PARTS:
            tl.store(dst + cols[None, :], x.to(Q.dtype.element_ty), mask=mask)
        else:
            tl.store(dst + cols[None, :], x.to(PACKED.dtype.element_ty), mask=mask)

    @triton.jit
    def cross_entropy_kernel(
        LOGITS, TARGETS, SCALE, LOSS, ARGMAX, DLOGITS, stride, stride_d, ignore_index,
        V: tl.constexpr, GRAD: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """One row of logits: its cross-entropy (logsumexp - the target's logit; 0 where the target
        is ignore_index) and its argmax (the first of equal maxima, as torch's), in one pass of an
        online softmax; when GRAD, a second pass writes d loss / d logits = (softmax - one-hot) *
        scale into DLOGITS (0 on an ignored row), which may be the logits themselves. The torch form
        makes ~8 passes over float32 copies of the logits (cast, argmax, log_softmax, exp, scatter,
        scale, cast back). V is a compile-time constant (one build per vocabulary), so the loops'
        bounds are too (the interpreter needs that)."""
        row = tl.program_id(0).to(tl.int64)
        base = LOGITS + row * stride
        target = tl.load(TARGETS + row)
        valid = target != ignore_index
        running_max = -float("inf")
        total = 0.0
        best_index = 0
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(tl.float32)
            block_max = tl.max(x, axis=0)
            # strictly greater: an equal maximum in a later block keeps the first one's index
            best_index = tl.where(block_max > running_max, start + tl.argmax(x, axis=0), best_index)
            new_max = tl.maximum(running_max, block_max)
            total = total * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
            running_max = new_max
        lse = running_max + tl.log(total)
        target_logit = tl.load(base + target, mask=valid, other=0.0).to(tl.float32)
        tl.store(LOSS + row, tl.where(valid, lse - target_logit, 0.0))
        tl.store(ARGMAX + row, best_index)  # stored as int64
        if GRAD:
            scale = tl.where(valid, tl.load(SCALE), 0.0)
            for start in range(0, V, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(base + cols, mask=cols < V, other=0.0).to(tl.float32)
                p = tl.exp(x - lse)
                p = tl.where(cols == target, p - 1.0, p) * scale
                tl.store(DLOGITS + row * stride_d + cols, p.to(DLOGITS.dtype.element_ty), mask=cols < V)

    @triton.jit
    def decode_qkv_kernel(
        QKV, Q, K_CACHE, V_CACHE, COS, SIN, POSITION, qkv_b, qkv_h, q_b, q_h, cache_b, cache_h, cache_t,
        H, KV, hd, n_rot, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """One head of one sequence's new token (a decoding step), from the fused projection's output
        (B, 1, H + 2 KV, hd): a q head turned by RoPE into Q (B, H, 1, hd); a k head turned, or a v
        head as it is, written into its KV cache (B, KV, ctx, hd) at the position held on the device.
        COS/SIN: that position's (1, n_rot) rows. One launch for what took two RoPE launches and two
        index_copy calls per layer of a CUDA-graphed decoding step."""
        b = tl.program_id(0)
        head = tl.program_id(1)
        cols = tl.arange(0, BLOCK)
        in_row = cols < hd
        src = QKV + b * qkv_b + head * qkv_h
        x = tl.load(src + cols, mask=in_row, other=0.0).to(tl.float32)
        if head < H + KV:  # q and k heads: RoPE
            half = n_rot // 2
            rotated = in_row & (cols < n_rot)
            partner = tl.where(cols < half, cols + half, cols - half)
            x_partner = tl.load(src + partner, mask=rotated, other=0.0).to(tl.float32)
            cos = tl.load(COS + cols, mask=rotated, other=1.0)
            sin = tl.load(SIN + cols, mask=rotated, other=0.0)
            x = x * cos + tl.where(cols < half, -1.0, 1.0) * x_partner * sin
        position = tl.load(POSITION)
        if head < H:
            tl.store(Q + b * q_b + head * q_h + cols, x.to(Q.dtype.element_ty), mask=in_row)
        elif head < H + KV:
            dst = K_CACHE + b * cache_b + (head - H) * cache_h + position * cache_t
            tl.store(dst + cols, x.to(K_CACHE.dtype.element_ty), mask=in_row)
        else:
            dst = V_CACHE + b * cache_b + (head - H - KV) * cache_h + position * cache_t
            tl.store(dst + cols, x.to(V_CACHE.dtype.element_ty), mask=in_row)
