"""The training loop: `train(model_cfg, train_cfg, data, out_dir, callbacks)`.

`trainer.run_setup.start_run` builds the run (a `trainer.run.TrainRun`), `trainer.train_step`
computes each optimizer step and the validation loss; this module steps, logs, evaluates,
checkpoints and checks for stop requests in between.

Reproducibility rules these modules keep (they make a resumed run bitwise equal to an uninterrupted
one on CPU):
- every batch comes from the data sampler, whose position is checkpointed; a step draws all
  batch_size * grad_accum windows at once and splits them into micro-batches, so the data (and the
  loss curve) does not depend on how the batch is split;
- the learning rate is a pure function of the step (trainer.optim.lr_at);
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
from trainer.metrics_file import MetricsFile
from trainer.optim import lr_at, set_lr
from trainer.run import StartInfo, TrainRun
from trainer.run_setup import start_run
from trainer.train_step import OptimizerStep, evaluate

if TYPE_CHECKING:  # trainer.data is imported lazily (see trainer.run_setup)
    from trainer.data import TokenData
    from trainer.tokenizers import Tokenizer

StopReason = Literal["completed", "stop", "pause", "time_limit"]


class Callbacks:
    """Hooks for the service (and the CLI's progress display). All no-ops; override what you need.
    They run on the training thread between steps, so keep them cheap."""

    def on_start(self, info: StartInfo) -> None:
        """info: total_steps, start_step, n_params, tokens_per_step, device, dtype."""

    def on_step(
        self, step: int, train_loss: float, lr: float, grad_norm: float, tokens_per_s: float, tokens_seen: int
    ) -> None:
        """Called every `log_every` steps (and on the last step)."""

    def on_eval(self, step: int, val_loss: float) -> None:
        pass

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


@dataclass
class TrainResult:
    step: int
    tokens_seen: int
    stop_reason: StopReason
    final_checkpoint: Path | None  # final/ when completed; the step checkpoint written on stop/pause
    best_val_loss: float | None
    last_train_loss: float | None
    last_val_loss: float | None


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

    train_path is a text/JSONL file or a prepared `trainer.data.TokenData` (then `tokenizer` is
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
    metrics = MetricsFile(
        run.out_dir / "metrics.jsonl", keep_upto=run.step if run.resume_path is not None else None
    )
    callbacks.on_start(run.start_info())
    try:
        stop_reason = _train_steps(run, metrics, callbacks)
        final = _final_checkpoint(run, stop_reason, callbacks)
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
    )


def _train_steps(run: TrainRun, metrics: MetricsFile, callbacks: Callbacks) -> StopReason:
    """Take optimizer steps until total_steps or a stop request; returns why it ended."""
    cfg = run.cfg
    optimizer_step = OptimizerStep(run)
    clock = _Clock(run.tokens_seen)
    run.model.train()
    while run.step < run.total_steps:
        stop = _stop_requested(run, callbacks, clock)
        if stop is not None:
            return stop
        lr = lr_at(run.step, cfg, run.total_steps)
        set_lr(run.optimizer, lr)
        x, y = run.sampler.next_batch()
        loss, grad_norm = optimizer_step(
            x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True)
        )
        run.step += 1
        run.tokens_seen += run.tokens_per_step

        if _due(run, cfg.log_every):
            _log_step(run, metrics, callbacks, clock, lr, loss, grad_norm)
        with clock.not_training():
            if run.make_val_sampler is not None and _due(run, cfg.eval_every):
                _evaluate(run, metrics, callbacks)
            if cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0 and run.step < run.total_steps:
                callbacks.on_checkpoint(run.step, run.save_step_checkpoint())
    return "completed"


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
    loss: torch.Tensor,
    grad_norm: torch.Tensor,
) -> None:
    """Report the step's loss (the one device sync per logged step); a NaN/inf loss ends the run."""
    train_loss = run.last_train_loss = loss.item()
    if not math.isfinite(train_loss):
        raise TrainingDiverged(run.step, train_loss)
    norm = float(grad_norm)
    tokens_per_s = clock.tokens_per_s(run.tokens_seen)
    metrics.write(
        {
            "step": run.step,
            "train_loss": train_loss,
            "lr": lr,
            "grad_norm": norm,
            "tokens_per_s": tokens_per_s,
            "tokens_seen": run.tokens_seen,
            "time": time.time(),
        }
    )
    callbacks.on_step(run.step, train_loss, lr, norm, tokens_per_s, run.tokens_seen)


def _evaluate(run: TrainRun, metrics: MetricsFile, callbacks: Callbacks) -> None:
    """Validation loss of this step; a new best is saved to best/."""
    assert run.make_val_sampler is not None
    val_loss = run.last_val_loss = evaluate(
        run.fwd, run.make_val_sampler, run.cfg.eval_batches, run.device, run.autocast
    )
    metrics.write(
        {
            "step": run.step,
            "val_loss": val_loss,
            "val_ppl": math.exp(min(val_loss, 700.0)),
            "time": time.time(),
        }
    )
    callbacks.on_eval(run.step, val_loss)
    if val_loss < run.best_val:
        run.best_val = val_loss
        run.save(run.out_dir / "best")


def _final_checkpoint(run: TrainRun, stop_reason: StopReason, callbacks: Callbacks) -> Path:
    """final/ when completed; otherwise a step checkpoint of the current step (written now unless
    one is already on disk), so a stopped or paused run can resume from where it ended."""
    if stop_reason == "completed":
        return run.save(run.out_dir / "final")
    if run.last_checkpoint_step == run.step:
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
