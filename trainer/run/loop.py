"""The training loop: `train(model_cfg, train_cfg, data, out_dir, callbacks)`, read top to bottom:
set-up (trainer.run.setup), then per step the batch, the optimizer step (trainer.run.step), the
report of its loss (trainer.run.report), evaluation and checkpoints; then the end: a full validation
pass and final/, or a checkpoint to resume from.

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

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.config import ModelConfig, TrainConfig
from trainer.config.metrics import EvalMetrics, FullEvalMetrics
from trainer.optim.optimizers import lr_at, set_lr
from trainer.run.report import Callbacks, Report, StopReason
from trainer.run.setup import start_run
from trainer.run.state import TrainRun
from trainer.run.step import OptimizerStep, evaluate, evaluate_batches, next_batch

if TYPE_CHECKING:  # trainer.data.prepare is imported lazily (see trainer.run.setup)
    from trainer.data.prepare import TokenData
    from trainer.data.tokenizers import Tokenizer


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
    """Train a Llama; see docs/INTERFACES.md for the contract. train_path: a text/JSONL file or a
    prepared TokenData (with its `tokenizer`). A resumed run takes the model config and tokenizer from
    its checkpoint and the training config from train_cfg (so max_steps can be raised)."""
    # set-up: the config checked, data tokenized, model and optimizer built, a resumed run restored
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
    cfg = run.cfg
    report = Report(run, callbacks or Callbacks())  # metrics.jsonl and the callbacks (rank 0)
    optimizer_step = OptimizerStep(run)
    run.model.train()
    stop: StopReason | None = None
    try:
        while run.step < run.total_steps and (stop := report.stop_requested()) is None:
            # the step: the learning rate of this step, a batch, forward/backward and the update
            lr = lr_at(run.step, cfg, run.total_steps)
            set_lr(run.optimizer, lr)
            result = optimizer_step(*next_batch(run))
            run.step += 1
            run.tokens_seen += run.tokens_per_step
            if due(run, cfg.log_every):
                report.step(lr, result)  # the loss (a NaN ends the run), and the ranks' stop decision
            if not run.is_main and not run.sharded:
                continue  # DDP: rank 0 evaluates and saves alone; FSDP: every rank takes part
            with report.not_training():
                if run.make_val_sampler is not None and due(run, cfg.eval_every):
                    evaluate_and_keep_best(run, report)
                if checkpoint_due(run):
                    report.checkpoint(run.save_step_checkpoint())
        # the end: final/ (after a full validation pass), or a checkpoint a stopped run resumes from
        stop_reason: StopReason = stop or "completed"
        final = final_checkpoint(run, stop_reason, report)
    finally:
        report.close()
    return _result(run, stop_reason, final)


def _result(run: TrainRun, stop_reason: StopReason, final: Path | None) -> TrainResult:
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


def due(run: TrainRun, every: int) -> bool:
    """Every `every` steps, and on the last step."""
    return run.step % every == 0 or run.step == run.total_steps


def checkpoint_due(run: TrainRun) -> bool:
    """Every `checkpoint_every` steps (0: never) except the last, which final/ covers."""
    every = run.cfg.checkpoint_every
    return every > 0 and run.step % every == 0 and run.step < run.total_steps


def evaluate_and_keep_best(run: TrainRun, report: Report) -> None:
    """Validation loss and accuracy of this step (eval_batches batches); a new best loss is saved
    to best/."""
    assert run.make_val_sampler is not None
    val_loss, val_accuracy = evaluate(
        _eval_fwd(run), run.make_val_sampler, run.cfg.eval_batches, run.device, run.autocast
    )
    run.last_val_loss, run.last_val_accuracy = val_loss, val_accuracy
    report.evaluation(EvalMetrics(step=run.step, val_loss=val_loss, val_accuracy=val_accuracy))
    if val_loss < run.best_val:
        run.best_val = val_loss
        run.save(run.out_dir / "best")


def _eval_fwd(run: TrainRun) -> torch.nn.Module:
    """What evaluation calls: rank 0 evaluates alone, so not through the DDP wrapper."""
    return run.model if run.ddp is not None else run.fwd


def full_evaluation(run: TrainRun, report: Report) -> None:
    """The final full validation pass (trainer.data.batches.full_pass), reported before the final
    checkpoint is written so the service stores it with that checkpoint."""
    if run.make_full_pass is None:
        return
    result = evaluate_batches(_eval_fwd(run), run.make_full_pass(), run.device, run.autocast)
    if result is None:
        return
    run.full_valid = result
    loss, accuracy = result
    report.full_evaluation(
        FullEvalMetrics(step=run.step, full_valid_loss=loss, full_valid_mean_token_accuracy=accuracy)
    )


def final_checkpoint(run: TrainRun, stop_reason: StopReason, report: Report) -> Path | None:
    """final/ when completed; otherwise a step checkpoint of the current step (written now unless
    one is already on disk), so a stopped or paused run can resume from where it ended. A run that
    ends as a model (completed, or at the time limit) gets its full validation pass first. Only
    rank 0 writes (the other ranks of a distributed run return None; sharded, they take part in the
    full pass and the save, which are collective)."""
    if not run.is_main and not run.sharded:
        return None
    if stop_reason in ("completed", "time_limit"):
        full_evaluation(run, report)
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
    report.checkpoint(path)
    return path
