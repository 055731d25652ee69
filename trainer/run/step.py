"""What one training step computes: `OptimizerStep` (forward/backward over grad_accum micro-batches,
then an AdamW, Muon or L-BFGS update) and `evaluate` / `evaluate_batches` (validation loss and accuracy).

The loss of a step is the mean cross-entropy over the step's targets that the loss covers (y is
IGNORE_INDEX elsewhere: trainer.data.batches), whatever the micro-batch split: each micro-batch adds the
*sum* of its token losses divided by the whole step's target count, so a micro-batch with few covered
targets weighs little and one with none adds exactly nothing (no mean over zero tokens, no NaN).
Token accuracy (argmax of the logits == target, over the same targets) is counted beside it on the
device; both are read when the loop logs, so it costs no extra device sync per step.

Dropout (TrainConfig.dropout > 0) draws its masks from the device's default generator, seeded afresh
for every micro-batch from (seed, step, the micro-batch's index in the step's global batch) and put
back as it was after the step (`DropoutSeeds`). So the masks, like the data, do not depend on how the
batch is split over processes (rank r's i-th micro-batch is global micro-batch r * grad_accum + i:
every rank draws its own masks, and identical seeds on every rank would give every rank the same
masks), a resumed run draws exactly the masks the uninterrupted run drew whatever RNG state was
checkpointed, and L-BFGS's line search sees the same masks at every evaluation of a step. At
dropout 0 nothing is seeded or drawn.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from trainer.model.llama import IGNORE_INDEX
from trainer.run.state import TrainRun

if TYPE_CHECKING:
    from trainer.data.batches import Batch, BatchSampler


class StepResult(NamedTuple):
    """A step's loss, gradient norm (before clipping) and token accuracy, as device tensors
    (reading them syncs)."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    accuracy: torch.Tensor


def count_targets(y: torch.Tensor) -> int:
    """Targets the loss covers in a batch; call it on the CPU tensor (on a device it would sync)."""
    return int((y != IGNORE_INDEX).sum())


def next_batch(run: TrainRun) -> tuple[torch.Tensor, torch.Tensor, int]:
    """This rank's share of the step's global batch (all of it in one process) on the device, and
    the global batch's target count (counted on the CPU: every rank draws the whole batch, so the
    count needs no collective)."""
    x, y = run.sampler.next_batch()
    n_targets = count_targets(y)
    x, y = run.local_batch(x, y)
    return to_device(x, run.device), to_device(y, run.device), n_targets


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch tensor on the device without waiting for it: on CUDA through pinned memory, since a
    copy from pageable memory waits for the work queued before it (the previous step), which
    would keep the host from queueing the next step while the GPU still computes this one."""
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _correct(predicted: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many covered targets the logits' argmax (the model's `argmax=True` output) predicts
    (IGNORE_INDEX never equals an argmax)."""
    return (predicted == y).sum()


def dropout_seed(seed: int, step: int, micro_batch: int) -> int:
    """The seed of one micro-batch's dropout masks (see the module docstring): a 64-bit hash of the
    three, so neighbouring steps and micro-batches get unrelated streams."""
    return int(np.random.SeedSequence([seed, step, micro_batch]).generate_state(1, np.uint64)[0])


def device_generator(device: torch.device) -> torch.Generator:
    """The default generator that random ops on `device` draw from (dropout, SDPA's dropout_p and
    inductor's compiled dropout alike)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


class DropoutSeeds:
    """Seeds the device generator for each micro-batch of a step with dropout (see the module
    docstring); does nothing at dropout 0."""

    def __init__(self, run: TrainRun):
        self.run = run
        self.generator = device_generator(run.device) if run.cfg.resolved_dropout > 0 else None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """The generator's state put back afterwards: the run's own RNG stream (checkpointed) does
        not depend on dropout."""
        if self.generator is None:
            yield
            return
        state = self.generator.get_state()
        try:
            yield
        finally:
            self.generator.set_state(state)

    def micro_batch(self, i: int) -> None:
        """Seed the masks of this rank's i-th micro-batch of the current step."""
        if self.generator is not None:
            run = self.run
            self.generator.manual_seed(
                dropout_seed(run.cfg.seed, run.step, run.rank * run.cfg.grad_accum + i)
            )


class OptimizerStep:
    """`step(x, y, n_targets) -> StepResult` for a batch of batch_size * grad_accum windows; n_targets
    is count_targets(y), counted on the CPU before y moved to the device. With several processes
    (trainer.run.collectives) x, y are this rank's slice and n_targets counts the whole global batch; the
    loss and accuracy returned are then this rank's share of the step's (their sum over ranks)."""

    def __init__(self, run: TrainRun):
        self.run = run
        self.params = [p for p in run.model.parameters() if p.requires_grad]  # after sharding: the shards
        self.max_norm = run.cfg.grad_clip if run.cfg.grad_clip > 0 else math.inf  # inf: measure only
        self.lbfgs = run.cfg.optimizer == "lbfgs"
        self.dropout = DropoutSeeds(run)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, n_targets: int) -> StepResult:
        return self._lbfgs_step(x, y, n_targets) if self.lbfgs else self._adamw_step(x, y, n_targets)

    def _forward_backward(
        self, x: torch.Tensor, y: torch.Tensor, n_targets: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Accumulate gradients of the step's mean loss over grad_accum micro-batches; returns that
        loss and the token accuracy. Splitting one drawn batch keeps the data independent of
        grad_accum."""
        run, k = self.run, self.run.cfg.grad_accum
        denominator = max(n_targets, 1)  # no target at all: every term is 0, so the loss is 0
        loss_sum = torch.zeros((), device=run.device)
        correct = torch.zeros((), device=run.device, dtype=torch.int64)
        with self.dropout.step():
            for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
                self.dropout.micro_batch(i)
                loss, hits = self._micro_batch(xm, ym, i, denominator)
                loss_sum += loss
                correct += hits
        return loss_sum, correct / denominator

    def _micro_batch(
        self, xm: torch.Tensor, ym: torch.Tensor, i: int, denominator: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of the i-th micro-batch: its share of the step's loss (detached) and
        its count of correct predictions."""
        run, k = self.run, self.run.cfg.grad_accum
        # DDP all-reduces the gradients in the last micro-batch's backward only
        sync = run.ddp.no_sync() if run.ddp is not None and i < k - 1 else contextlib.nullcontext()
        if run.sharded:
            from trainer.run.fsdp import set_gradient_sync

            set_gradient_sync(run.model, i == k - 1)
        with sync:
            with run.autocast():
                # the argmax, not the logits: the loss may then run fused (trainer.model.linear_cross_entropy)
                predicted, loss = run.fwd(xm, ym, reduction="sum", argmax=True)
            hits = _correct(predicted, ym)
            loss = loss / denominator
            # n_targets counts the global batch; DDP averages over the ranks, x world makes it the sum
            scaled = loss * run.world if run.world > 1 else loss
            run.scaler.scale(scaled).backward()
        return loss.detach(), hits

    def _adamw_step(self, x: torch.Tensor, y: torch.Tensor, n_targets: int) -> StepResult:
        optimizer, scaler = self.run.optimizer, self.run.scaler
        loss, accuracy = self._forward_backward(x, y, n_targets)
        scaler.unscale_(optimizer)  # no-op when the scaler is disabled
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        if self.run.sharded:
            from trainer.run.fsdp import full_norm

            grad_norm = full_norm(grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return StepResult(loss, grad_norm, accuracy)

    def _lbfgs_step(self, x: torch.Tensor, y: torch.Tensor, n_targets: int) -> StepResult:
        """One outer L-BFGS iteration; its line search may evaluate the batch several times (the
        reported norm and accuracy are those of the first evaluation, at the step's starting point,
        like the loss L-BFGS returns)."""
        optimizer = self.run.optimizer
        first: list[torch.Tensor] = []

        def closure() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=False)
            loss, accuracy = self._forward_backward(x, y, n_targets)
            if not first:
                first.extend([torch.nn.utils.clip_grad_norm_(self.params, math.inf), accuracy])
            return loss

        state = optimizer.state[optimizer.param_groups[0]["params"][0]]  # where torch's L-BFGS keeps it
        evals_before = state.get("func_evals", 0)
        loss = optimizer.step(closure)  # type: ignore[arg-type]  # L-BFGS takes a closure returning a tensor
        if state.get("func_evals", 0) - evals_before <= 1 or float(state.get("t", 1.0)) == 0.0:
            # The step did not move: no line search ran (the direction from the curvature pairs was
            # not a descent direction on this batch) or it found no acceptable point (t = 0). With no
            # new pair L-BFGS would take the same direction, and stall, on every later step: forget
            # the pairs, so the next step starts again from steepest descent.
            state.clear()
        optimizer.zero_grad(set_to_none=True)
        return StepResult(torch.as_tensor(loss), first[0], first[1])


@torch.no_grad()
def evaluate_batches(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager[None]],
    interrupted: Callable[[], bool] = lambda: False,
) -> tuple[float, float] | None:
    """(loss, token accuracy) over the covered targets of all the batches together (each target
    weighs the same, whichever batch it is in); None when they hold no covered target, or when
    `interrupted()` (asked before each batch) says the run is being stopped."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    count = 0
    try:
        for x, y in batches:
            if interrupted():
                return None
            count += count_targets(y)
            yd = to_device(y, device)
            with autocast():
                predicted, loss = model(to_device(x, device), yd, reduction="sum", argmax=True)
            total += loss.double()
            correct += _correct(predicted, yd)
    finally:
        model.train(was_training)
    if count == 0:
        return None
    return float(total / count), float(correct.double() / count)


def evaluate(
    model: torch.nn.Module,
    make_sampler: Callable[[], BatchSampler],
    n_batches: int,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager[None]],
    interrupted: Callable[[], bool] = lambda: False,
) -> tuple[float, float] | None:
    """(loss, token accuracy) over the first n_batches of a freshly seeded sampler (the same batches
    every call; the sampler draws only windows with a covered target, so there is always one); None
    when interrupted."""
    sampler = make_sampler()
    batches = (sampler.next_batch() for _ in range(n_batches))
    return evaluate_batches(model, batches, device, autocast, interrupted)
