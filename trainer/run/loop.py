"""The training loop: `train(model_cfg, train_cfg, data, out_dir, callbacks)`.

`trainer.run.setup.start_run` builds the run (a `trainer.run.state.TrainRun`), `trainer.run.step`
computes each optimizer step and the validation loss; this module steps, logs, evaluates,
checkpoints and checks for stop requests in between.

Reproducibility rules these modules keep (they make a resumed run bitwise equal to an uninterrupted
one on CPU):
- every batch comes from the data sampler, whose position is checkpointed; a step draws all
  batch_size * grad_accum windows at once and splits them into micro-batches, so the data (and the
  loss curve) does not depend on how the batch is split;
- the learning rate is a pure function of the step (trainer.optim.optimizers.lr_at);
- evaluation uses a fresh, separately seeded sampler each time, so it sees the same batches every
  time and never touches the training sampler or the global RNGs;
- model weights, optimizer tensors and RNG states are saved exactly (fp32 safetensors + JSON).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from trainer.config import ModelConfig, TrainConfig
from trainer.config.metrics import EvalMetrics, FullEvalMetrics, StepMetrics
from trainer.optim.optimizers import lr_at, set_lr
from trainer.run.memory import peak_memory_bytes
from trainer.run.metrics_file import MetricsFile, NoMetricsFile
from trainer.run.setup import start_run
from trainer.run.state import StartInfo, TrainRun
from trainer.run.step import OptimizerStep, StepResult, count_targets, evaluate, evaluate_batches

if TYPE_CHECKING:  # trainer.data.prepare is imported lazily (see trainer.run.setup)
    from trainer.data.prepare import TokenData
    from trainer.data.tokenizers import Tokenizer

StopReason = Literal["completed", "stop", "pause", "time_limit"]
_STOP_BY_CODE: dict[int, StopReason | None] = {0: None, 1: "stop", 2: "pause", 3: "time_limit"}


class Callbacks:
    """Hooks for the service (and the CLI's progress display). All no-ops; override what you need.
    They run on the training thread between steps, so keep them cheap."""

    def on_start(self, info: StartInfo) -> None:
        """info: total_steps, start_step, n_params, tokens_per_step, device, dtype."""

    def on_step(self, metrics: StepMetrics) -> None:
        """Called every `log_every` steps (and on the last step)."""

    def on_eval(self, metrics: EvalMetrics) -> None:
        """The validation loss and token accuracy (eval_batches batches), every `eval_every` steps."""

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        """The final full validation pass (every validation window once), before the run's final
        checkpoint is written; only for runs that end completed or at the time limit and have
        validation data."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        """A complete `checkpoints/step-XXXXXXXX` folder (periodic, or written on stop/pause/time
        limit). final/ and best/ are reported through TrainResult and the folder layout instead."""

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


@dataclass
class TrainResult:
    step: int
    tokens_seen: int
    stop_reason: StopReason
    final_checkpoint: Path | None  # final/ when completed; the step checkpoint written on stop/pause
    best_val_loss: float | None
    last_train_loss: float | None
    last_val_loss: float | None
    last_train_accuracy: float | None = None
    last_val_accuracy: float | None = None
    full_valid_loss: float | None = None  # the final full validation pass (None: none was made)
    full_valid_accuracy: float | None = None


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    train_path: str | os.PathLike[str] | TokenData,
    out_dir: Path,
    callbacks: Callbacks | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    validation_path: str | os.PathLike[str] | None = None,
    resume: bool | Path = False,
    init_from: Path | None = None,
) -> TrainResult:
    """Train a Llama; see docs/INTERFACES.md for the contract.

    train_path is a text/JSONL file or a prepared `trainer.data.prepare.TokenData` (then `tokenizer` is
    required). Resuming takes the model config and tokenizer from the checkpoint and the training
    config from `train_cfg` (so max_steps can be raised). `resume=True` with no checkpoint in
    out_dir starts a fresh run; a fresh run refuses an out_dir that already holds checkpoints.
    """
    callbacks = callbacks or Callbacks()
    run = start_run(
        model_cfg,
        train_cfg,
        train_path,
        Path(out_dir),
        tokenizer=tokenizer,
        validation_path=validation_path,
        resume=resume,
        init_from=init_from,
    )
    if run.is_main:
        metrics = MetricsFile(
            run.out_dir / "metrics.jsonl", keep_upto=run.step if run.resume_path is not None else None
        )
    else:  # the other ranks of a distributed run report nothing (trainer.run.collectives)
        metrics, callbacks = NoMetricsFile(), Callbacks()
    callbacks.on_start(run.start_info())
    try:
        stop_reason = _train_steps(run, metrics, callbacks)
        final = _final_checkpoint(run, stop_reason, callbacks, metrics)
    finally:
        metrics.close()
    return TrainResult(
        step=run.step,
        tokens_seen=run.tokens_seen,
        stop_reason=stop_reason,
        final_checkpoint=final,
        best_val_loss=run.best_val_loss,
        last_train_loss=run.last_train_loss,
        last_val_loss=run.last_val_loss,
        last_train_accuracy=run.last_train_accuracy,
        last_val_accuracy=run.last_val_accuracy,
        full_valid_loss=run.full_valid[0] if run.full_valid else None,
        full_valid_accuracy=run.full_valid[1] if run.full_valid else None,
    )


def _train_steps(run: TrainRun, metrics: MetricsFile, callbacks: Callbacks) -> StopReason:
    """Take optimizer steps until total_steps or a stop request; returns why it ended."""
    cfg = run.cfg
    optimizer_step = OptimizerStep(run)
    clock = _Clock(run.tokens_seen)
    run.model.train()
    # Several processes: rank 0's stop request as all ranks agreed on it, before the first step and
    # then in each logged step's all-reduce (so they all leave the loop at the same step).
    agreed = _agree_stop(run, callbacks, clock) if run.world > 1 else None
    while run.step < run.total_steps:
        stop = _stop_requested(run, callbacks, clock) if run.world == 1 else agreed
        if stop is not None:
            return stop
        lr = lr_at(run.step, cfg, run.total_steps)
        set_lr(run.optimizer, lr)
        x, y = run.sampler.next_batch()
        n_targets = count_targets(y)  # of the global batch, which every rank draws
        x, y = run.local_batch(x, y)
        result = optimizer_step(
            x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True), n_targets
        )
        run.step += 1
        run.tokens_seen += run.tokens_per_step

        if _due(run, cfg.log_every):
            agreed = _log_step(run, metrics, callbacks, clock, lr, result)
        if not run.is_main and not run.sharded:
            continue  # DDP: rank 0 evaluates and saves alone; FSDP: every rank takes part
        with clock.not_training():
            if run.make_val_sampler is not None and _due(run, cfg.eval_every):
                _evaluate(run, metrics, callbacks)
            if cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0 and run.step < run.total_steps:
                callbacks.on_checkpoint(run.step, run.save_step_checkpoint())
    return "completed"


def _agree_stop(run: TrainRun, callbacks: Callbacks, clock: _Clock) -> StopReason | None:
    """Rank 0's stop request, broadcast to every rank."""
    from trainer.run.collectives import STOP_CODES, agree_stop

    code = STOP_CODES[_stop_requested(run, callbacks, clock)] if run.is_main else 0
    return _STOP_BY_CODE[agree_stop(code, run.device)]


def _due(run: TrainRun, every: int) -> bool:
    """Every `every` steps, and on the last step."""
    return run.step % every == 0 or run.step == run.total_steps


def _stop_requested(run: TrainRun, callbacks: Callbacks, clock: _Clock) -> StopReason | None:
    """A stop/pause asked for through the callbacks, or the time limit reached (checked between steps)."""
    request = callbacks.should_stop()
    if request == "stop" or request == "pause":
        return request
    if run.cfg.time_limit is not None and clock.elapsed() >= run.cfg.time_limit:
        return "time_limit"
    return None


def _log_step(
    run: TrainRun,
    metrics: MetricsFile,
    callbacks: Callbacks,
    clock: _Clock,
    lr: float,
    result: StepResult,
) -> StopReason | None:
    """Report the step's loss, gradient norm and accuracy, read in one transfer (the one device sync
    per logged step); a NaN/inf loss ends the run. Several processes: the loss and accuracy are
    summed over the ranks (each holds its share) in one all-reduce that also carries rank 0's stop
    request, which is returned (the gradients, hence the norm, are the same on every rank)."""
    loss = result.loss.detach().float()
    accuracy_t = result.accuracy.float()
    stop_t = torch.zeros((), device=loss.device)
    if run.world > 1:
        import torch.distributed as dist

        from trainer.run.collectives import STOP_CODES

        if run.is_main:
            stop_t += STOP_CODES[_stop_requested(run, callbacks, clock)]
        shared = torch.stack([loss, accuracy_t, stop_t])
        dist.all_reduce(shared)
        loss, accuracy_t, stop_t = shared.unbind()
    values = torch.stack([loss, result.grad_norm.detach().float().to(loss.device), accuracy_t, stop_t])
    train_loss, norm, accuracy, stop_code = values.tolist()
    run.last_train_loss, run.last_train_accuracy = train_loss, accuracy
    if not math.isfinite(train_loss):
        raise TrainingDiverged(run.step, train_loss)
    measured = StepMetrics(
        step=run.step,
        train_loss=train_loss,
        train_accuracy=accuracy,
        lr=lr,
        grad_norm=norm,
        tokens_per_s=clock.tokens_per_s(run.tokens_seen),
        tokens_seen=run.tokens_seen,
        peak_memory_bytes=peak_memory_bytes(run.device),
    )
    metrics.write(measured)
    callbacks.on_step(measured)
    return _STOP_BY_CODE[round(stop_code)]


def _evaluate(run: TrainRun, metrics: MetricsFile, callbacks: Callbacks) -> None:
    """Validation loss and accuracy of this step; a new best loss is saved to best/."""
    assert run.make_val_sampler is not None
    val_loss, val_accuracy = evaluate(
        _eval_fwd(run), run.make_val_sampler, run.cfg.eval_batches, run.device, run.autocast
    )
    run.last_val_loss, run.last_val_accuracy = val_loss, val_accuracy
    measured = EvalMetrics(step=run.step, val_loss=val_loss, val_accuracy=val_accuracy)
    metrics.write(measured)
    callbacks.on_eval(measured)
    if val_loss < run.best_val:
        run.best_val = val_loss
        run.save(run.out_dir / "best")


def _eval_fwd(run: TrainRun) -> torch.nn.Module:
    """What evaluation calls: rank 0 evaluates alone, so not through the DDP wrapper."""
    return run.model if run.ddp is not None else run.fwd


def _full_evaluation(run: TrainRun, metrics: MetricsFile, callbacks: Callbacks) -> None:
    """The final full validation pass (trainer.data.batches.full_pass), reported before the final
    checkpoint is written so the service stores it with that checkpoint."""
    if run.make_full_pass is None:
        return
    result = evaluate_batches(_eval_fwd(run), run.make_full_pass(), run.device, run.autocast)
    if result is None:
        return
    run.full_valid = result
    loss, accuracy = result
    measured = FullEvalMetrics(step=run.step, full_valid_loss=loss, full_valid_mean_token_accuracy=accuracy)
    metrics.write(measured)
    callbacks.on_full_eval(measured)


def _final_checkpoint(
    run: TrainRun, stop_reason: StopReason, callbacks: Callbacks, metrics: MetricsFile
) -> Path | None:
    """final/ when completed; otherwise a step checkpoint of the current step (written now unless
    one is already on disk), so a stopped or paused run can resume from where it ended. A run that
    ends as a model (completed, or at the time limit) gets its full validation pass first. Only
    rank 0 writes (the other ranks of a distributed run return None; sharded, they take part in the
    full pass and the save, which are collective)."""
    if not run.is_main and not run.sharded:
        return None
    if stop_reason in ("completed", "time_limit"):
        _full_evaluation(run, metrics, callbacks)
    if stop_reason == "completed":
        return run.save(run.out_dir / "final")
    if run.last_checkpoint_step == run.step:
        if not run.is_main:
            return None  # rank 0 decides below without a collective
        if (run.step_checkpoint_path() / "state.json").exists():
            return run.step_checkpoint_path()
        if run.resume_path is not None:
            return run.resume_path  # stopped before taking a step after resuming
    path = run.save_step_checkpoint()
    callbacks.on_checkpoint(run.step, path)
    return path


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
