"""What `auto` becomes for the settings that depend on how much text a run has next to its model
(issue 21): dropout, the evaluation cadence and early stopping. Decided once, at the start of a run,
from its training tokens, the model's parameters and the run's steps; each decision comes with the
sentence that explains it, printed at start like `dtype auto`.

The rules and the measurements they come from (bench/README.md, "regularization": best validation
loss over 3 data sizes x 2 model sizes x dropout 0/0.1/0.2, each run to its best):
- dropout: 0 from 1 training token per parameter up (there dropout 0 ended lowest, or within 0.02);
  0.1 between 0.1 and 1 token per parameter (+0.04 to +0.13 over 0); 0.2 below 0.1 (0.2 beat 0.1).
- early stopping: on (patience 4) when the run passes over its training tokens more than once: only
  repeated text can be memorized, and the measured runs had their best after 3 to 15 passes; off when
  the run sees each token at most once, where the curve has no bottom to stop at.
- evaluation cadence: 20 evaluations over the run (every total_steps / 20 steps, at least 10): the
  measured bests came anywhere from 9% of a run's steps to its end, and 20 evaluations put one
  within 5% of the run of any bottom.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config.train import TrainConfig

NO_DROPOUT_FROM = 1.0  # training tokens per parameter
HIGH_DROPOUT_BELOW = 0.1
LOW_DROPOUT, HIGH_DROPOUT = 0.1, 0.2
# admission (the API, before any tokenizing) takes a file's fewest tokens as its bytes / this for
# BPE (the vocabularies trained here average well under 8 bytes a token), so it never expects less
# dropout, and so less memory, than the run will decide on its real tokens
BPE_MAX_BYTES_PER_TOKEN = 8
AUTO_PATIENCE = 4
EVALUATIONS_PER_RUN = 20
MIN_EVAL_EVERY = 10


@dataclass(frozen=True)
class AutoChoice:
    """What one `auto` setting became, and why."""

    field: str
    value: float | int
    reason: str


def auto_dropout(train_tokens: int, params: int) -> AutoChoice:
    ratio = train_tokens / max(params, 1)
    if ratio >= NO_DROPOUT_FROM:
        value, why = 0.0, f">= {NO_DROPOUT_FROM:g}"
    elif ratio >= HIGH_DROPOUT_BELOW:
        value, why = LOW_DROPOUT, f"between {HIGH_DROPOUT_BELOW:g} and {NO_DROPOUT_FROM:g}"
    else:
        value, why = HIGH_DROPOUT, f"< {HIGH_DROPOUT_BELOW:g}"
    return AutoChoice(
        "dropout",
        value,
        f"auto: {train_tokens:,} training tokens for {params:,} parameters, {ratio:.2g} per parameter ({why})",
    )


def admission_dropout(cfg: TrainConfig, max_train_tokens: int, params: int) -> float:
    """The dropout to plan a job's memory for: its own, or the most `auto` can decide for a file of
    at most `max_train_tokens` training tokens."""
    if cfg.dropout is not None:
        return cfg.dropout
    fewest = max_train_tokens // (BPE_MAX_BYTES_PER_TOKEN if cfg.tokenizer == "bpe" else 1)
    return float(auto_dropout(fewest, params).value)


def auto_early_stopping_patience(train_tokens: int, planned_tokens: int, evaluates: bool) -> AutoChoice:
    if not evaluates:
        return AutoChoice("early_stopping_patience", 0, "auto: off, the run has no evaluations to stop on")
    passes = planned_tokens / max(train_tokens, 1)
    if passes > 1:
        return AutoChoice(
            "early_stopping_patience",
            AUTO_PATIENCE,
            f"auto: the run passes over its training tokens {passes:.3g} times, so it can overfit",
        )
    return AutoChoice(
        "early_stopping_patience",
        0,
        f"auto: off, the run sees each training token at most once ({passes:.2g} passes)",
    )


def auto_eval_every(total_steps: int) -> AutoChoice:
    every = max(MIN_EVAL_EVERY, round(total_steps / EVALUATIONS_PER_RUN))
    evaluations = -(-total_steps // every)  # each multiple of `every`, and the last step
    return AutoChoice(
        "eval_every",
        every,
        f"auto: {evaluations} evaluation{'s' if evaluations != 1 else ''} over {total_steps:,} steps "
        f"(about {EVALUATIONS_PER_RUN} a run, at least {MIN_EVAL_EVERY} steps apart)",
    )


def resolve_auto(
    cfg: TrainConfig,
    *,
    train_tokens: int,
    val_tokens: int,
    params: int,
    total_steps: int,
    tokens_per_step: int,
) -> tuple[TrainConfig, list[AutoChoice]]:
    """The config with each data-aware `auto` (unset) field decided, and the decisions."""
    choices: list[AutoChoice] = []
    if cfg.dropout is None:
        choices.append(auto_dropout(train_tokens, params))
    eval_every = cfg.eval_every
    if eval_every is None:
        no_data = AutoChoice("eval_every", 0, "auto: off, the run has no validation data")
        choices.append(auto_eval_every(total_steps) if val_tokens > 0 else no_data)
        eval_every = int(choices[-1].value)
    if cfg.early_stopping_patience is None:
        evaluates = val_tokens > 0 and eval_every > 0
        choices.append(auto_early_stopping_patience(train_tokens, total_steps * tokens_per_step, evaluates))
    return cfg.model_copy(update={c.field: c.value for c in choices}), choices
