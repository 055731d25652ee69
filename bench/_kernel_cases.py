"""bench/kernel_speed.py's cases: each fused Triton kernel of the eager CUDA step (trainer.model.
triton_ops) and the torch-op form the step runs without Triton (trainer.model.fused_ops' autograd
functions), as training calls them (gradients on), at a model's training shape, with the bytes the
kernel must move at least (each input read once, each output written once)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.config import ModelConfig
from trainer.config.fused_loss import chunk_rows
from trainer.model import fused_ops, linear_cross_entropy, triton_ops
from trainer.model.llama import rope_cache

BF16 = torch.bfloat16
EPS = 1e-5


@dataclass(frozen=True)
class Case:
    name: str
    bytes: int
    triton: Callable[[], object]
    torch_ops: Callable[[], object]


def _leaf(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(*shape, device=device).to(dtype).requires_grad_()


def _backward(
    out: torch.Tensor | tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> Callable[[], object]:
    """A backward through the graph built once (kept for the next call), with random gradients
    drawn the same for both forms of a kernel (their results are compared)."""
    outs = out if isinstance(out, tuple) else (out,)
    generator = torch.Generator(outs[0].device).manual_seed(0)
    grads = [torch.randn(o.shape, generator=generator, device=o.device).to(o.dtype) for o in outs]
    return lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True)


def rms_norm_cases(rows: int, d: int, device: torch.device) -> list[Case]:
    """The residual stream is float32 (float32 weights under bf16 autocast); the norm's output,
    the next matmul's input, bf16."""
    x, w = _leaf(rows, d, dtype=torch.float32, device=device), _leaf(d, dtype=torch.float32, device=device)

    def ours() -> torch.Tensor:
        return triton_ops.RMSNorm.apply(x, w, EPS, BF16, True)

    def theirs() -> torch.Tensor:
        return fused_ops._RMSNorm.apply(x, w, EPS, BF16)

    return [
        Case("rms_norm forward", rows * d * (4 + 2), ours, theirs),
        Case(  # g (bf16) and x read, dx (float32) written
            "rms_norm backward",
            rows * d * (2 + 4 + 4),
            _backward(ours(), (x, w)),
            _backward(theirs(), (x, w)),
        ),
    ]


def add_rms_norm_cases(rows: int, d: int, device: torch.device) -> list[Case]:
    """A block's residual add (float32 x, bf16 branch output h) and the norm after it: one kernel
    each way (triton_ops.AddRMSNorm) against the add and the Triton RMSNorm as the step ran them
    before, each in the op's own kernel."""
    x, w = _leaf(rows, d, dtype=torch.float32, device=device), _leaf(d, dtype=torch.float32, device=device)
    h = _leaf(rows, d, dtype=BF16, device=device)

    def ours() -> tuple[torch.Tensor, torch.Tensor]:
        return triton_ops.AddRMSNorm.apply(x, h, w, EPS, BF16)

    def apart() -> tuple[torch.Tensor, torch.Tensor]:
        s = x + h
        return s, triton_ops.RMSNorm.apply(s, w, EPS, BF16, True)

    return [
        Case("add+rms_norm fwd vs apart", rows * d * (4 + 2 + 4 + 2), ours, apart),
        Case(  # ds (float32), dy (bf16) and s read; dx (float32) and dh (bf16) written
            "add+rms_norm bwd vs apart",
            rows * d * (4 + 2 + 4 + 4 + 2),
            _backward(ours(), (x, h, w)),
            _backward(apart(), (x, h, w)),
        ),
    ]


def qkv_cases(cfg: ModelConfig, batch: int, device: torch.device) -> list[Case]:
    """The fused projection's bf16 output split into q, k, v (heads first), q and k turned."""
    H, KV, hd, T = cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.ctx
    qkv = _leaf(batch, T, H + 2 * KV, hd, dtype=BF16, device=device)
    cos, sin = (t.to(device) for t in rope_cache(cfg, T))
    tables = triton_ops.rope_tables(cos, sin)
    views = cos.unsqueeze(1), sin.unsqueeze(1)  # as fused_ops.qkv_heads passes them to the torch form

    def ours() -> tuple[torch.Tensor, ...]:
        return triton_ops.QKV.apply(qkv, *tables, (H, KV), BF16)

    def theirs() -> tuple[torch.Tensor, ...]:
        return fused_ops._QKV.apply(qkv, *views, (H, KV), BF16)

    moved = 2 * qkv.numel() * 2  # read once, written once
    return [
        Case("qkv split + rope forward", moved, ours, theirs),
        Case("qkv split + rope backward", moved, _backward(ours(), (qkv,)), _backward(theirs(), (qkv,))),
    ]


def swiglu_cases(rows: int, hidden: int, device: torch.device) -> list[Case]:
    """h = [gate | up] (bf16, the fused w1/w3 projection's output) -> silu(gate) * up."""
    h = _leaf(rows, 2 * hidden, dtype=BF16, device=device)
    ours, theirs = triton_ops.SwiGLU.apply, fused_ops._SwiGLU.apply
    return [
        Case("swiglu forward", rows * 3 * hidden * 2, lambda: ours(h), lambda: theirs(h)),
        Case(  # g and h read, dh written
            "swiglu backward", rows * 5 * hidden * 2, _backward(ours(h), (h,)), _backward(theirs(h), (h,))
        ),
    ]


def cross_entropy_case(tokens: int, vocab: int, d: int, device: torch.device) -> Case:
    """One chunk of the fused loss (trainer.model.linear_cross_entropy) at a training step's size:
    its bf16 logits -> each row's loss and argmax, and the logits' bf16 gradient (a mean's). The
    bytes: the logits read once and the gradient written once (the kernel reads them twice)."""
    rows = chunk_rows(tokens, vocab)
    hidden, weight = (
        torch.randn(rows, d, device=device).to(BF16),
        torch.randn(vocab, d, device=device).to(BF16),
    )
    targets = torch.randint(0, vocab, (rows,), device=device)
    chunks = linear_cross_entropy._Chunks(hidden, weight, targets, -100, True, BF16, True, True)
    logits = (3 * torch.randn(rows, vocab, device=device)).to(BF16)
    grad, argmax = torch.empty_like(logits), torch.empty(rows, dtype=torch.int64, device=device)
    assert chunks.scale is not None  # a mean's

    def ours() -> torch.Tensor:
        triton_ops.cross_entropy_rows(logits, targets, -100, chunks.scale, argmax, grad)
        return grad

    def theirs() -> torch.Tensor | None:
        return chunks._torch_rows(logits, 0, rows)

    return Case(f"cross-entropy {rows}x{vocab}", 2 * logits.numel() * 2, ours, theirs)


def cases(cfg: ModelConfig, batch: int, vocab: int, device: torch.device) -> list[Case]:
    rows = batch * cfg.ctx
    return [
        *rms_norm_cases(rows, cfg.n_embd, device),
        *add_rms_norm_cases(rows, cfg.n_embd, device),
        *qkv_cases(cfg, batch, device),
        *swiglu_cases(rows, cfg.hidden_dim, device),
        cross_entropy_case(rows, vocab, cfg.n_embd, device),
    ]


def relative_difference(ours: object, theirs: object) -> float:
    """The largest |ours - theirs| over every output tensor, relative to theirs' largest |value|."""
    pairs = zip(_tensors(ours), _tensors(theirs), strict=True)
    return max(
        ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()
        for a, b in pairs
    )


def _tensors(out: object) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, tuple | list) else (out,)) if isinstance(t, torch.Tensor)]
