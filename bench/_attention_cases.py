"""Causal attention, forward and backward, through each of torch's SDPA backends at the training
shapes of bench/kernel_speed.py's step (llama-110m) and of the ~1.2B config: which backend the
model's attention should prefer on the GPU at hand. At ctx 2048 the attention is ~14% of the 1.2B's
FLOPs; cuDNN's kernels are said to beat flash-attention 2 on Hopper, and this measures it there.

Each backend that takes the shape is timed; the others are named with the reason. The largest
relative difference of each backend's output from the first backend's is printed beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench._gpu_rows import Row, emit

CUDA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
CPU_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH)


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    heads: int
    ctx: int
    head_dim: int

    def causal_flops(self) -> float:
        """Forward and backward FLOPs of causal attention: the forward's two matmuls over half the
        score matrix, the backward's 2.5 times the forward's (as flash-attention counts them)."""
        forward = 2 * 2 * self.batch * self.heads * self.ctx * self.ctx * self.head_dim / 2
        return 3.5 * forward


def shapes(smoke: bool) -> list[Shape]:
    if smoke:
        return [Shape("tiny", 1, 2, 16, 16)]
    return [Shape("llama-110m", 16, 12, 1024, 64), Shape("1.2B", 8, 16, 2048, 128)]


def attention_step(shape: Shape, device: torch.device) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    """(a forward and backward of causal SDPA in bf16 returning its output, the q/k/v gradients'
    sum of the output's gradient), as the model's attention calls it."""
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (
        torch.randn(shape.batch, shape.heads, shape.ctx, shape.head_dim, device=device, generator=g)
        .to(torch.bfloat16)
        .requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn(q.shape, device=device, generator=g).to(torch.bfloat16)

    def step() -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), grad)
        return out

    return step, grad


def compare_backends(
    seconds_of: Callable[[Callable[[], object]], float], device: torch.device, smoke: bool
) -> None:
    """Times every backend at every shape; prints a line per backend and emits its time."""
    backends = CUDA_BACKENDS if device.type == "cuda" else CPU_BACKENDS
    for shape in shapes(smoke):
        step, _ = attention_step(shape, device)
        first: torch.Tensor | None = None
        print(
            f"attention {shape.name} (B {shape.batch}, H {shape.heads}, T {shape.ctx}, hd {shape.head_dim}):"
        )
        for backend in backends:
            try:
                with sdpa_kernel(backend):
                    seconds = seconds_of(step)
                    out = step().detach().float()
            except RuntimeError as e:  # this backend does not take the shape (or is not built)
                reason = (str(e).strip() or type(e).__name__).splitlines()[0]
                print(f"  {backend.name:20s} not available: {reason[:120]}")
                continue
            first = out if first is None else first
            difference = float((out - first).abs().max() / first.abs().max())
            tflops = shape.causal_flops() / seconds / 1e12
            print(
                f"  {backend.name:20s} {seconds * 1e3:9.3f} ms  {tflops:7.1f} TFLOP/s  rel diff {difference:.1e}"
            )
            emit(Row("kernels", f"attention {shape.name} fwd+bwd: {backend.name}", seconds * 1e3, "ms"))
