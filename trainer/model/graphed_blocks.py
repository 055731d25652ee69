"""Transformer blocks replayed as CUDA graphs in training (TrainConfig.cuda_graphs; when a run may
use them: trainer.run.cuda_graphs). torch.cuda.make_graphed_callables captures each block's
forward and backward once; a step then replays two graphs per block instead of launching each of
its kernels. Llama.forward takes the graphs for a training input of the captured shape and runs
the eager blocks for anything else (evaluation, decoding, another batch shape)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from trainer.model.llama import Llama


class BlockStep(nn.Module):
    """A block's training forward, (x, cos, sin) -> x, as a module of its own: the graphed forward
    replaces this wrapper's, not the block's, which evaluation and decoding call with a cache."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.block(x, cos, sin)


class GraphedBlocks:
    """The captured blocks, and the input they were captured for. A plain object, not a module, so
    the model's parameters and state dict stay as they were."""

    def __init__(self, steps: tuple[Callable[..., Any], ...], x: torch.Tensor):
        self.steps = steps
        self.shape, self.dtype = x.shape, x.dtype

    def fits(self, x: torch.Tensor) -> bool:
        """Whether x is a training input the graphs were captured for."""
        return x.shape == self.shape and x.dtype == self.dtype and x.requires_grad and torch.is_grad_enabled()


def capture(model: Llama, batch_size: int, dtype: torch.dtype) -> GraphedBlocks:
    """Captures every block's forward and backward for inputs of (batch_size, ctx) tokens in the
    run's precision (autocast to `dtype` unless float32; autocast's cast cache must be off while
    capturing), in one memory pool, in the order a step runs them."""
    cfg = model.cfg
    device = model.rope_cos.device
    cos, sin = model.rope_cos[: cfg.ctx], model.rope_sin[: cfg.ctx]  # the views forward passes
    shape = (batch_size, cfg.ctx, cfg.n_embd)
    samples = tuple((torch.randn(shape, device=device, requires_grad=True), cos, sin) for _ in model.layers)
    steps = tuple(BlockStep(block) for block in model.layers)
    autocast = torch.autocast(device.type, dtype=dtype, cache_enabled=False, enabled=dtype != torch.float32)
    with autocast:
        graphed = torch.cuda.make_graphed_callables(steps, samples)
    return GraphedBlocks(graphed, samples[0][0])
