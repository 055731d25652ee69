"""What one training step computes: `OptimizerStep` (forward/backward over grad_accum micro-batches,
then an AdamW or L-BFGS update) and `evaluate` (the validation loss)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from trainer.run import TrainRun

if TYPE_CHECKING:
    from trainer.data import BatchSampler


class OptimizerStep:
    """`step(x, y) -> (loss, grad_norm)` for a batch of batch_size * grad_accum windows: the batch
    mean loss and the gradient norm before clipping, as device tensors (reading them syncs)."""

    def __init__(self, run: TrainRun):
        self.run = run
        self.params = [p for p in run.model.parameters() if p.requires_grad]
        self.max_norm = run.cfg.grad_clip if run.cfg.grad_clip > 0 else math.inf  # inf: measure only
        self.lbfgs = run.cfg.optimizer == "lbfgs"

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._lbfgs_step(x, y) if self.lbfgs else self._adamw_step(x, y)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Accumulate gradients of the batch mean loss over grad_accum micro-batches; returns that
        loss. Splitting one drawn batch keeps the data independent of grad_accum."""
        run, k = self.run, self.run.cfg.grad_accum
        loss_sum = torch.zeros((), device=run.device)
        for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
            with run.autocast():
                _, loss = run.fwd(xm, ym)
            loss = loss / k
            run.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        return loss_sum

    def _adamw_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        optimizer, scaler = self.run.optimizer, self.run.scaler
        loss = self._forward_backward(x, y)
        scaler.unscale_(optimizer)  # no-op when the scaler is disabled
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm

    def _lbfgs_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One outer L-BFGS iteration; its line search may evaluate the batch several times (the
        reported norm is that of the first evaluation, at the step's starting point)."""
        optimizer = self.run.optimizer
        norms: list[torch.Tensor] = []

        def closure() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=False)
            loss = self._forward_backward(x, y)
            if not norms:
                norms.append(torch.nn.utils.clip_grad_norm_(self.params, math.inf))
            return loss

        loss = optimizer.step(closure)  # type: ignore[arg-type]  # L-BFGS takes a closure returning a tensor
        optimizer.zero_grad(set_to_none=True)
        return torch.as_tensor(loss), norms[0]


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    make_sampler: Callable[[], BatchSampler],
    n_batches: int,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager[None]],
) -> float:
    """Mean loss over the first n_batches of a freshly seeded sampler (the same batches every call)."""
    was_training = model.training
    model.eval()
    sampler = make_sampler()
    total = torch.zeros((), device=device, dtype=torch.float64)
    for _ in range(n_batches):
        x, y = sampler.next_batch()
        with autocast():
            _, loss = model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        total += loss.double()
    model.train(was_training)
    return float(total / n_batches)
