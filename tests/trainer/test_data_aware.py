"""The data-aware `auto` settings (trainer.config.data_aware): dropout from training tokens per
parameter, 20 evaluations per run, early stopping when the run repeats its data; decided at the
start of a run, used by it, printed with the reason and kept in its checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import SHAKESPEARE
from tests.trainer.test_loop import Recorder
from trainer.config import ModelConfig, TrainConfig
from trainer.config.data_aware import (
    auto_dropout,
    auto_early_stopping_patience,
    auto_eval_every,
    resolve_auto,
)
from trainer.run.loop import train


@pytest.mark.parametrize(
    ("tokens", "params", "dropout"),
    [
        (2_000_000, 1_000_000, 0.0),
        (1_000_000, 1_000_000, 0.0),
        (999_999, 1_000_000, 0.1),
        (100_000, 1_000_000, 0.1),
        (99_999, 1_000_000, 0.2),
        (1_000, 1_000_000, 0.2),
    ],
)
def test_dropout_falls_as_the_data_grows_next_to_the_model(tokens: int, params: int, dropout: float) -> None:
    choice = auto_dropout(tokens, params)
    assert (choice.field, choice.value) == ("dropout", dropout)
    assert f"{tokens:,} training tokens for {params:,} parameters" in choice.reason


def test_early_stopping_is_on_only_when_the_run_repeats_its_data_and_evaluates() -> None:
    assert auto_early_stopping_patience(1000, 3000, evaluates=True).value == 4
    assert auto_early_stopping_patience(1000, 1000, evaluates=True).value == 0
    assert auto_early_stopping_patience(1000, 3000, evaluates=False).value == 0


@pytest.mark.parametrize(("steps", "every"), [(1000, 50), (10_000, 500), (100, 10), (5, 10), (1010, 50)])
def test_twenty_evaluations_per_run_at_least_ten_steps_apart(steps: int, every: int) -> None:
    assert auto_eval_every(steps).value == every


def test_set_values_are_kept_and_only_unset_ones_decided() -> None:
    cfg = TrainConfig(dropout=0.3, eval_every=7, early_stopping_patience=None)
    decided, choices = resolve_auto(
        cfg, train_tokens=1000, val_tokens=100, params=10**6, total_steps=100, tokens_per_step=100
    )
    assert [c.field for c in choices] == ["early_stopping_patience"]
    assert (decided.dropout, decided.eval_every, decided.early_stopping_patience) == (0.3, 7, 4)


def test_without_validation_data_auto_evaluates_never_and_says_why() -> None:
    """val_fraction 0 and no validation file: eval_every auto is off (it said "1 evaluation over
    5 steps" next to early stopping's "the run has no evaluations")."""
    decided, choices = resolve_auto(
        TrainConfig(), train_tokens=1000, val_tokens=0, params=10**6, total_steps=5, tokens_per_step=100
    )
    assert (decided.eval_every, decided.early_stopping_patience) == (0, 0)
    assert [c.reason for c in choices if c.field == "eval_every"] == [
        "auto: off, the run has no validation data"
    ]


def test_auto_is_unset_until_a_run_decides_it() -> None:
    with pytest.raises(ValueError, match="dropout auto is decided when the run starts"):
        _ = TrainConfig().resolved_dropout


def test_a_run_decides_auto_from_its_data_reports_why_and_keeps_the_decision(tmp_path: Path) -> None:
    text = tmp_path / "small.txt"
    text.write_text(SHAKESPEARE.read_text()[:20_000])  # 18,000 training tokens for ~140k parameters
    model = ModelConfig(n_layer=2, n_head=4, n_embd=64, ctx=32)
    cfg = TrainConfig(max_steps=200, batch_size=4, dtype="float32", checkpoint_every=0, export_formats=[])
    rec = Recorder()
    result = train(model, cfg, text, tmp_path / "run", callbacks=rec)

    assert rec.started is not None
    auto: list[str] = rec.started["auto"]
    assert auto[0].startswith("dropout 0.1: auto: 18,000 training tokens for ")
    assert auto[1].startswith("eval_every 10: auto: 20 evaluations over 200 steps")
    assert len(rec.evals) == 20  # as many as it said
    assert auto[2].startswith("early_stopping_patience 4: auto: the run passes over its training tokens")
    evaluated = [step for step, _ in rec.evals]
    assert evaluated[:3] == [10, 20, 30]
    assert result.final_checkpoint is not None
    saved: dict[str, Any] = json.loads((result.final_checkpoint / "config.json").read_text())
    assert (saved["train"]["dropout"], saved["train"]["eval_every"]) == (0.1, 10)


@pytest.mark.parametrize(
    "steps, every, said",
    [
        (5, 10, "1 evaluation over 5"),
        (100, 10, "10 evaluations over 100"),
        (205, 10, "21 evaluations over 205"),
        (1_000, 50, "20 evaluations over 1,000"),
    ],
)
def test_auto_eval_every_counts_the_evaluations_the_run_makes(steps: int, every: int, said: str) -> None:
    from trainer.config.data_aware import auto_eval_every

    choice = auto_eval_every(steps)
    assert choice.value == every and choice.reason.startswith(f"auto: {said} steps")


def test_admission_plans_for_the_most_dropout_the_file_can_get() -> None:
    from trainer.config.data_aware import admission_dropout

    # byte tokenizer: a file's tokens are its bytes; BPE: as few as bytes / 8
    assert admission_dropout(TrainConfig(tokenizer="byte"), 2_000_000, 1_000_000) == 0.0
    assert admission_dropout(TrainConfig(tokenizer="bpe"), 2_000_000, 1_000_000) == 0.1
    assert admission_dropout(TrainConfig(tokenizer="bpe"), 700_000, 1_000_000) == 0.2
    assert admission_dropout(TrainConfig(tokenizer="bpe", dropout=0.0), 700_000, 1_000_000) == 0.0
