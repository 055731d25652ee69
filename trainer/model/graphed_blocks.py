"""Transformer blocks replayed as CUDA graphs in training (TrainConfig.cuda_graphs; when a run may
use them: trainer.run.cuda_graphs). torch.cuda.make_graphed_callables captures each block's
forward and backward once; a step then replays two graphs per block instead of launching each of
its kernels. Llama.forward takes the graphs for a training input of the captured shape and runs
the eager blocks for anything else (evaluation, decoding, another batch shape)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        return self.block(x, cos, sin)[0]


class GraphedBlocks:
    """The captured blocks, and the input they were captured for. A plain object, not a module, so
    the model's parameters and state dict stay as they were."""

    def __init__(self, steps: tuple[Callable[..., Any], ...], x: torch.Tensor):
        self.steps = steps
        self.shape, self.dtype = x.shape, x.dtype

    def fits(self, x: torch.Tensor) -> bool:
        """Whether x is a training input the graphs were captured for."""
        return x.shape == self.shape and x.dtype == self.dtype and x.requires_grad and torch.is_grad_enabled()


def _autocast(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    """The run's precision (autocast to `dtype` unless float32), without autocast's cast cache,
    which a capture must not use (and which a graph's replay would not refresh)."""
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False, enabled=dtype != torch.float32)


def capture(model: Llama, batch_size: int, dtype: torch.dtype) -> GraphedBlocks:
    """Captures every block's forward and backward for inputs of (batch_size, ctx) tokens in the
    run's precision, in one memory pool, in the order a step runs them. The blocks themselves are
    left as they were: where this raises, the model trains eager as before."""
    cfg = model.cfg
    device = model.rope_cos.device
    cos, sin = model.rope_cos[: cfg.ctx], model.rope_sin[: cfg.ctx]  # the views forward passes
    shape = (batch_size, cfg.ctx, cfg.n_embd)
    samples = tuple((_random_input(shape, device, torch.float32), cos, sin) for _ in model.layers)
    steps = tuple(BlockStep(block) for block in model.layers)
    with _autocast(device, dtype):
        graphed = torch.cuda.make_graphed_callables(steps, samples)
    return GraphedBlocks(graphed, samples[0][0])


def difference_from_eager(model: Llama, graphed: GraphedBlocks, dtype: torch.dtype) -> float:
    """How far the first captured block's replay is from the eager block on a fresh input: the
    largest relative difference (norm of the difference over the norm) of its output and of its
    input's gradient. Replaying the same kernels, it is ~0; a capture that recorded something other
    than the step (a stale pointer, a host-side branch) shows here, before any training step uses it."""
    cfg = model.cfg
    x = _random_input(graphed.shape, model.rope_cos.device, graphed.dtype)
    cos, sin = model.rope_cos[: cfg.ctx], model.rope_sin[: cfg.ctx]
    outputs, input_grads = [], []
    for step in (graphed.steps[0], BlockStep(model.layers[0])):
        with _autocast(x.device, dtype):
            y = step(x, cos, sin)
        (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))  # leaves the parameters' .grad alone
        outputs.append(y.detach().float())
        input_grads.append(grad.float())
    return max(_relative(a, b) for a, b in (outputs, input_grads))


def _random_input(shape: Sequence[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Normal values from a generator of their own: the run's random streams stay as they were."""
    generator = torch.Generator(device).manual_seed(0)
    return torch.randn(tuple(shape), device=device, dtype=dtype, generator=generator).requires_grad_()


def _relative(found: torch.Tensor, expected: torch.Tensor) -> float:
    return float((found - expected).norm() / expected.norm().clamp(min=1e-30))
