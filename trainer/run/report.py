"""`Report`: what a run tells the outside while it trains (the `Callbacks` hooks and metrics.jsonl),
and what it hears back (stop and pause requests).

Rank 0 writes metrics.jsonl (trainer.run.metrics_file) and calls the callbacks; the other ranks of a
distributed run report nothing. The report also keeps the run's clock (tokens/s that leave out
evaluation and checkpoints, and the time limit) and decides when to stop: a stop or pause asked for
through the callbacks, early stopping (the run's evaluations), or the time limit. With several processes rank 0's decision reaches every
rank in the all-reduce of each logged step (and one broadcast before the first step), so all ranks
leave the loop after the same step.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch

from trainer.config.metrics import EvalMetrics, FullEvalMetrics, StepMetrics
from trainer.run.collectives import STOP_CODES, agree_stop, all_reduce_sum
from trainer.run.memory import PeakMemory
from trainer.run.metrics_file import MetricsFile, NoMetricsFile
from trainer.run.step_read import QueuedRead, deferred_reads_on

if TYPE_CHECKING:
    from trainer.run.state import StartInfo, TrainRun
    from trainer.run.step import StepResult

StopReason = Literal["completed", "stop", "pause", "time_limit", "early_stop"]
# the number that stands for each in the ranks' collectives, read back
_STOP_BY_CODE: dict[int, StopReason | None] = {
    code: cast("StopReason | None", r) for r, code in STOP_CODES.items()
}
# the runs that end as a model (final/, exports, a job's fine-tuned model); the others end with a
# checkpoint to resume from
ENDS_AS_MODEL: frozenset[StopReason] = frozenset({"completed", "time_limit", "early_stop"})


class Callbacks:
    """Hooks for the service (and the CLI's progress display). All no-ops; override what you need.
    They run on the training thread between steps, so keep them cheap."""

    def on_start(self, info: StartInfo) -> None:
        """info: total_steps, start_step, n_params, tokens_per_step, device, dtype."""

    def on_step(self, metrics: StepMetrics) -> None:
        """Called every `log_every` steps (and on the last step); on CUDA once the next step is queued
        (trainer.run.step_read)."""

    def on_eval(self, metrics: EvalMetrics) -> None:
        """The validation loss and token accuracy (eval_batches batches), every `eval_every` steps."""

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        """The final full validation pass (every validation window once) of the run's model, at its
        step (best/'s when the run ended past its best; a sharded run's last step), before final/
        is written; only for runs that end as a model (ENDS_AS_MODEL) and have validation data."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        """A complete `checkpoints/step-XXXXXXXX` folder (periodic, or of the last step: written on
        stop/pause/time limit/early stop, or when final/ is best/'s). final/ and best/ are reported
        through TrainResult and the folder layout instead."""

    def on_note(self, message: str) -> None:
        """Something the run decided while running (compile auto, after timing its first steps)."""

    def should_stop(self) -> Literal["stop", "pause"] | None:
        return None


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""

    code = "training_diverged"

    def __init__(self, step: int, loss: float):
        self.step, self.loss = step, loss
        super().__init__(
            f"training diverged at step {step}: the loss is {loss}. Lower the learning rate, "
            "use more warmup steps or gradient clipping, or train in float32."
        )

    def __reduce__(self) -> tuple[type[TrainingDiverged], tuple[int, float]]:
        return TrainingDiverged, (self.step, self.loss)  # a distributed rank's error crosses processes


class Report:
    """Opened by trainer.run.loop.train once the run is built; `on_start` is called here."""

    def __init__(self, run: TrainRun, callbacks: Callbacks):
        self.run = run
        if run.is_main:
            keep_upto = run.step if run.resume_path is not None else None
            self.metrics, self.callbacks = MetricsFile(run.out_dir / "metrics.jsonl", keep_upto), callbacks
        else:
            self.metrics, self.callbacks = NoMetricsFile(), Callbacks()
        self.callbacks.on_start(run.start_info())
        self.peak_memory = PeakMemory(run.device)  # the run's peak, not the worker process's
        self.clock = _Clock(run.tokens_seen)
        self.agreed: StopReason | None = self._agree_stop() if run.world > 1 else None
        # a logged step's numbers not yet read: on CUDA, until the next step is queued (step_read)
        self.deferred = deferred_reads_on(run.device.type)
        self.queued: QueuedRead | None = None

    def close(self) -> None:
        self.metrics.close()

    def stop_requested(self) -> StopReason | None:
        """Asked between steps: one process decides now; several take what they last agreed on."""
        return self._asked_to_stop() if self.run.world == 1 else self.agreed

    def step(self, lr: float, result: StepResult) -> None:
        """Queue the step's loss, gradient norm and accuracy for reading, in one transfer; read at
        once, or on CUDA by `read_queued` once the next step is queued (trainer.run.step_read).
        Several processes: loss and accuracy are summed over the ranks (each holds its share) in one
        all-reduce that also carries rank 0's stop code (the gradients, hence the norm, are the same
        on every rank)."""
        run = self.run
        loss, accuracy = result.loss.detach().float(), result.accuracy.float()
        stop = torch.zeros((), device=loss.device)
        if run.world > 1:
            if run.is_main:
                stop += STOP_CODES[self._asked_to_stop()]
            loss, accuracy, stop = all_reduce_sum(torch.stack([loss, accuracy, stop])).unbind()
        norm = result.grad_norm.detach().float().to(loss.device)
        values = torch.stack([loss, norm, accuracy, stop])
        self.read_queued()  # a step logged before this one, not read yet: first
        self.queued = QueuedRead.queue(run.step, run.tokens_seen, lr, values)
        if not self.deferred:
            self.read_queued()

    def read_queued(self) -> None:
        """Reports the logged step queued for reading, if any (a NaN/inf loss ends the run). The loop
        calls it after queueing each step, and before what must see every step reported: an
        evaluation, a checkpoint, the end."""
        queued, self.queued = self.queued, None
        if queued is None:
            return
        train_loss, grad_norm, train_accuracy, stop_code = queued.read()
        self.run.last_train_loss, self.run.last_train_accuracy = train_loss, train_accuracy
        if not math.isfinite(train_loss):
            raise TrainingDiverged(queued.step, train_loss)
        measured = StepMetrics(
            step=queued.step,
            train_loss=train_loss,
            train_accuracy=train_accuracy,
            lr=queued.lr,
            grad_norm=grad_norm,
            tokens_per_s=self.clock.tokens_per_s(queued.tokens_seen),
            tokens_seen=queued.tokens_seen,
            peak_memory_bytes=self.peak_memory.read(),
        )
        self.metrics.write(measured)
        self.callbacks.on_step(measured)
        self.agreed = _STOP_BY_CODE[round(stop_code)]

    def evaluation(self, measured: EvalMetrics) -> None:
        self.metrics.write(measured)
        self.callbacks.on_eval(measured)

    def full_evaluation(self, measured: FullEvalMetrics) -> None:
        self.metrics.write(measured)
        self.callbacks.on_full_eval(measured)

    def note(self, message: str) -> None:
        self.callbacks.on_note(message)

    def checkpoint(self, path: Path, step: int) -> None:
        """A step checkpoint is complete on disk (written in the background: `step` is its own)."""
        self.callbacks.on_checkpoint(step, path)

    def not_training(self) -> contextlib.AbstractContextManager[None]:
        """Time spent in here (evaluating, checkpointing) does not count against tokens/s."""
        return self.clock.not_training()

    def _asked_to_stop(self) -> StopReason | None:
        """A stop/pause asked for through the callbacks (it wins: the owner's word), early stopping's
        patience used up (trainer.run.state.TrainRun.patience_exhausted), or the time limit reached."""
        request = self.callbacks.should_stop()
        if request == "stop" or request == "pause":
            return request
        if self.run.patience_exhausted():
            return "early_stop"
        if self.run.cfg.time_limit is not None and self.clock.elapsed() >= self.run.cfg.time_limit:
            return "time_limit"
        return None

    def interrupted(self) -> bool:
        """Asked during an evaluation: a stop the owner asked for (a cancel, Ctrl-C) abandons it. A
        pause lets it finish, so the resumed run has every evaluation a straight one has (its early
        stopping too). One process only: several carry on, their stop agreed at the next step, as an
        evaluation is rank 0's alone."""
        return self.run.world == 1 and self.callbacks.should_stop() == "stop"

    def agree_early_stop(self) -> None:
        """Several processes, after an evaluation (rank 0's, or every rank's when sharded): rank 0's
        early-stopping decision, for every rank at once (a broadcast), not at the next logged step."""
        code = STOP_CODES["early_stop"] if self.run.is_main and self.run.patience_exhausted() else 0
        if (agreed := self._rank0_decides(code)) is not None:
            self.agreed = agreed

    def _agree_stop(self) -> StopReason | None:
        """Rank 0's stop request, broadcast to every rank (once, before the first step)."""
        return self._rank0_decides(STOP_CODES[self._asked_to_stop()] if self.run.is_main else 0)

    def _rank0_decides(self, code: int) -> StopReason | None:
        """Rank 0's stop code (the others pass 0), broadcast to every rank, as a stop reason."""
        return _STOP_BY_CODE[agree_stop(code, self.run.device)]


class _Clock:
    """Training time since the first step (for the time limit), and tokens/s between log points
    that leaves out the time spent evaluating and checkpointing."""

    def __init__(self, tokens_seen: int):
        self.start = time.perf_counter()
        self.last_log, self.last_log_tokens, self.excluded = self.start, tokens_seen, 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def tokens_per_s(self, tokens_seen: int) -> float:
        """Training throughput since the previous call."""
        now = time.perf_counter()
        tps = (tokens_seen - self.last_log_tokens) / max(now - self.last_log - self.excluded, 1e-9)
        self.last_log, self.last_log_tokens, self.excluded = now, tokens_seen, 0.0
        return tps

    @contextlib.contextmanager
    def not_training(self) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.excluded += time.perf_counter() - started
