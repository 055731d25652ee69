"""The training loop: `train(model_cfg, train_cfg, data, out_dir, callbacks)`, read top to bottom:
set-up (trainer.run.setup), then per step the batch, the optimizer step (trainer.run.step), the
report of its loss (trainer.run.report), evaluation and checkpoints; then the end: a full validation
pass and final/, the run's model, or a checkpoint to resume from.

The model is the last step's weights unless the run ended past its best evaluation (one after it was
no new best: early stopping stopped it, or it trained on without improving): then it is best/'s.
final/ holds the model; the last step's state is then also kept in checkpoints/, for --resume.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.checkpoint import checkpoint_of_step, copy_checkpoint, load_checkpoint, read_state
from trainer.config import ModelConfig, TrainConfig
from trainer.config.metrics import EvalMetrics, FullEvalMetrics
from trainer.optim.optimizers import lr_at, set_lr
from trainer.run.checkpoint_writer import CheckpointTimes
from trainer.run.report import ENDS_AS_MODEL, Callbacks, Report, StopReason
from trainer.run.setup import start_run
from trainer.run.state import TrainRun
from trainer.run.step import OptimizerStep, StepResult, evaluate, evaluate_batches, next_batch

if TYPE_CHECKING:  # trainer.data.prepare is imported lazily (see trainer.run.setup)
    from trainer.data.prepare import TokenData
    from trainer.data.tokenizers import Tokenizer


@dataclass
class TrainResult:
    step: int
    tokens_seen: int
    stop_reason: StopReason
    # final/ (the run's model) when the run ends as one (ENDS_AS_MODEL); else the step checkpoint
    # written on stop/pause
    final_checkpoint: Path | None
    best_val_loss: float | None
    last_train_loss: float | None
    last_val_loss: float | None
    last_train_accuracy: float | None = None
    last_val_accuracy: float | None = None
    full_valid_loss: float | None = None  # the final full validation pass (None: none was made)
    full_valid_accuracy: float | None = None
    best_step: int | None = None  # the step of best_val_loss (best/)
    evals_since_best: int = 0  # evaluations after best_step that were no new best
    model_step: int | None = None  # the step of final/'s weights (None: the run did not end as a model)
    # what the step checkpoints written in the background cost (the final one is written at the end)
    checkpoint_times: CheckpointTimes = field(default_factory=CheckpointTimes)

    @property
    def model_note(self) -> str | None:
        """What the model is when it is not the last step's weights, in words (a job's event, a line
        of `fromscratch train`); None when it is, or when the run did not end as a model."""
        if self.model_step is None or self.evals_since_best == 0 or self.best_val_loss is None:
            return None
        best = f"step {self.best_step} ({self.best_val_loss:.3f})"
        if self.model_step != self.best_step:
            return (
                f"Validation loss was lowest at {best}, but that checkpoint (best/) is gone; the model "
                f"is the last step's ({self.step})"
            )
        model = f"the model is the step-{self.best_step} checkpoint"
        if self.stop_reason == "early_stop":
            return (
                f"Validation loss has not improved for {self.evals_since_best} evaluations since {best}; "
                f"stopping; {model}. To train longer, raise early_stopping_patience (0 = off)"
            )
        return (
            f"Validation loss was lowest at {best} and did not improve in the {self.evals_since_best} "
            f"evaluations after it; {model} (the last step's, {self.step}, stays a checkpoint)"
        )


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
        while run.step < run.total_steps:
            between_steps(run, report)
            # asked after what was decided between steps: a stop asked while compile auto decided
            # comes before the compile (a minute) that the next step would run
            if (stop := report.stop_requested()) is not None:
                break
            # the step: the learning rate of this step, a batch, forward/backward and the update
            lr = lr_at(run.step, cfg, run.total_steps)
            set_lr(run.optimizer, lr)
            result = optimizer_step(*next_batch(run))
            run.step += 1
            run.tokens_seen += run.tokens_per_step
            after_step(run, report, lr, result)  # its report, evaluation and checkpoint
        # the end: final/ (after a full validation pass), or a checkpoint a stopped run resumes from
        report.read_queued()
        stop_reason: StopReason = stop or "completed"
        run.writer.wait()  # the end reads and reports what is written in the background
        final = final_checkpoint(run, stop_reason, report)
    finally:
        run.writer.close()  # after an error: the write in flight finishes, unreported
        report.close()
        if run.thread_tuner is not None:
            run.thread_tuner.restore()
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
        best_step=run.best_step,
        evals_since_best=run.evals_since_best,
        model_step=_model_step(run, stop_reason, final),
        checkpoint_times=run.writer.times,
    )


def _model_step(run: TrainRun, stop_reason: StopReason, final: Path | None) -> int | None:
    """The step of final/'s weights, on rank 0 (which wrote final/; the others return no result)."""
    if final is None or not run.is_main or stop_reason not in ENDS_AS_MODEL:
        return None
    return int(read_state(final)["step"])


def between_steps(run: TrainRun, report: Report) -> None:
    """A checkpoint written in the background goes to the callbacks; compile auto decides once it
    has timed the first steps (trainer.run.state.TrainRun.between_steps). Not training time."""
    with report.not_training():
        if (decided := run.between_steps()) is not None:
            report.note(decided)  # the service reads stop requests as it writes it


def after_step(run: TrainRun, report: Report, lr: float, result: StepResult) -> None:
    """The step's report (on CUDA the last logged step's, read once this one is queued:
    trainer.run.step_read), then its evaluation and checkpoint, which see every step reported."""
    cfg = run.cfg
    report.read_queued()
    if due(run, cfg.log_every):
        report.step(lr, result)  # the loss (a NaN ends the run), and the ranks' stop decision
    evaluating = run.make_val_sampler is not None and due(run, cfg.resolved_eval_every)
    checkpointing = checkpoint_due(run)
    if evaluating or checkpointing:
        report.read_queued()  # this step reported (its loss checked) before its weights are used
    if run.is_main or run.sharded:  # DDP: rank 0 evaluates and saves alone; FSDP: every rank
        with report.not_training():
            if evaluating:
                evaluate_and_keep_best(run, report)
            if checkpointing:
                run.save_step_checkpoint(report.checkpoint, background=True)
    if evaluating and run.world > 1 and cfg.resolved_early_stopping_patience > 0:
        report.agree_early_stop()  # every rank leaves after this step, as one process would


def due(run: TrainRun, every: int) -> bool:
    """Every `every` steps, and on the last step."""
    return run.step % every == 0 or run.step == run.total_steps


def checkpoint_due(run: TrainRun) -> bool:
    """Every `checkpoint_every` steps (0: never) except the last, which final/ covers."""
    every = run.cfg.checkpoint_every
    return every > 0 and run.step % every == 0 and run.step < run.total_steps


def evaluate_and_keep_best(run: TrainRun, report: Report) -> None:
    """Validation loss and accuracy of this step (eval_batches batches); a new best loss (by more
    than early_stopping_min_delta) is saved to best/, other losses count toward early stopping."""
    assert run.make_val_sampler is not None
    measured = evaluate(
        _eval_fwd(run),
        run.make_val_sampler,
        run.cfg.eval_batches,
        run.device,
        run.autocast,
        report.interrupted,
    )
    if measured is None:  # the run is being stopped: the evaluation is dropped, not waited for
        return
    val_loss, val_accuracy = measured
    run.last_val_loss, run.last_val_accuracy = val_loss, val_accuracy
    report.evaluation(EvalMetrics(step=run.step, val_loss=val_loss, val_accuracy=val_accuracy))
    if run.record_evaluation(val_loss):  # best/ keeps the weights (a model), not the optimizer
        run.save_in_background(run.out_dir / "best", optimizer=False)


def _eval_fwd(run: TrainRun) -> torch.nn.Module:
    """What evaluation calls: rank 0 evaluates alone, so not through the DDP wrapper."""
    return run.model if run.ddp is not None else run.fwd


def full_evaluation(run: TrainRun, report: Report, step: int) -> None:
    """The final full validation pass (trainer.data.batches.full_pass) of the model's weights now,
    which are step `step`'s, reported before final/ is written so the service stores it with it."""
    if run.make_full_pass is None:
        return
    result = evaluate_batches(
        _eval_fwd(run), run.make_full_pass(), run.device, run.autocast, report.interrupted
    )
    if result is None:
        return
    run.full_valid = result
    loss, accuracy = result
    report.full_evaluation(
        FullEvalMetrics(step=step, full_valid_loss=loss, full_valid_mean_token_accuracy=accuracy)
    )


def final_checkpoint(run: TrainRun, stop_reason: StopReason, report: Report) -> Path | None:
    """The end. A run that ends as a model (ENDS_AS_MODEL) gets a full validation pass of the model
    and final/: the last step's weights, or a copy of best/ when the run ended past its best (then
    the last step's state is kept as a step checkpoint too, which --resume continues from). A run
    stopped or paused gets a step checkpoint of its last step. Only rank 0 writes (the other ranks
    of a distributed run return None; sharded, they take part in the full pass and the saves, which
    are collective, and the full pass measures the last step: they hold shards, not best/)."""
    if not run.is_main and not run.sharded:
        return None
    if stop_reason not in ENDS_AS_MODEL:
        return last_step_checkpoint(run, report)
    at_best = run.evals_since_best == 0  # the last evaluation is the best (or there is none)
    if at_best or run.sharded:
        full_evaluation(run, report, run.step)
    if at_best and stop_reason == "completed":
        return run.save(run.out_dir / "final")
    last = last_step_checkpoint(run, report)
    if not run.is_main:
        return None
    assert last is not None  # rank 0 always has the last step's checkpoint
    best = None if at_best else checkpoint_of_step(run.out_dir / "best", run.best_step)
    if not at_best and not run.sharded:
        step = run.step  # best/ gone (a resumed run's folder without it): the last step is the model
        if best is not None:  # the last step is saved: the weights can become the model's
            model = load_checkpoint(best)
            run.model.load_state_dict(model.model_state)
            step = model.step
        full_evaluation(run, report, step)
    return copy_checkpoint(best or last, run.out_dir / "final")


def last_step_checkpoint(run: TrainRun, report: Report) -> Path | None:
    """A step checkpoint of the current step (written now unless one is already on disk), so a
    stopped, paused or finished run can resume from where it ended; reported to the callbacks."""
    if run.last_checkpoint_step == run.step:
        if not run.is_main:
            return None  # rank 0 decides below without a collective
        if (run.step_checkpoint_path() / "state.json").exists():
            return run.step_checkpoint_path()
        if run.resume_path is not None:
            return run.resume_path  # stopped before taking a step after resuming
    return run.save_step_checkpoint(report.checkpoint)
