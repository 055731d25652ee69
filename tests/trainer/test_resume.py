"""Exact resume: N steps + stop + resume + N steps == 2N straight steps, bitwise, on CPU fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import read_metrics, train_losses
from trainer.config.metrics import StepMetrics
from trainer.run.loop import train
from trainer.run.report import Callbacks


class StopAfter(Callbacks):
    def __init__(self, step: int, request: str = "pause"):
        self.step, self.request, self.last = step, request, 0

    def on_step(self, metrics: StepMetrics) -> None:
        self.last = metrics.step

    def should_stop(self):
        return self.request if self.last >= self.step else None


class CrashAt(Callbacks):
    def __init__(self, step: int):
        self.step = step

    def on_step(self, metrics: StepMetrics) -> None:
        if metrics.step == self.step:
            raise RuntimeError("simulated crash")


def tensors(folder: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(folder / name))


def assert_bitwise_equal(a: Path, b: Path) -> None:
    """The same weights, and the same optimizer state when the folders keep one (a weights-only
    checkpoint, best/ or a copy of it, has none: then neither may)."""
    names = ["model.safetensors"]
    if (a / "optimizer.safetensors").exists() or (b / "optimizer.safetensors").exists():
        names.append("optimizer.safetensors")
    for name in names:
        ta, tb = tensors(a, name), tensors(b, name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), f"{name}:{key} differs"


@pytest.mark.parametrize(
    "grad_accum,eval_every,samples_after_nl", [(1, 0, False), (2, 3, False), (2, 2, True)]
)
def test_pause_and_resume_is_bitwise_identical(
    tmp_path,
    tiny_model,
    tiny_train,
    shakespeare_data,
    byte_tokenizer,
    grad_accum,
    eval_every,
    samples_after_nl,
):
    cfg = tiny_train(
        max_steps=8, grad_accum=grad_accum, eval_every=eval_every, samples_after_nl=samples_after_nl
    )
    straight = train(tiny_model(), cfg, shakespeare_data, tmp_path / "straight", tokenizer=byte_tokenizer)

    first = train(
        tiny_model(), cfg, shakespeare_data, tmp_path / "resumed", StopAfter(4), tokenizer=byte_tokenizer
    )
    assert first.stop_reason == "pause" and first.step == 4
    second = train(
        tiny_model(), cfg, shakespeare_data, tmp_path / "resumed", tokenizer=byte_tokenizer, resume=True
    )
    assert second.stop_reason == "completed" and second.step == 8
    assert second.tokens_seen == straight.tokens_seen

    assert_bitwise_equal(tmp_path / "straight" / "final", tmp_path / "resumed" / "final")
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")  # exact, not approx
    assert second.last_val_loss == straight.last_val_loss
    assert second.best_val_loss == straight.best_val_loss
    vals = [(m["step"], m["val_loss"]) for m in read_metrics(tmp_path / "resumed") if "val_loss" in m]
    assert vals == [
        (m["step"], m["val_loss"]) for m in read_metrics(tmp_path / "straight") if "val_loss" in m
    ]


def test_resume_after_a_crash_from_the_last_periodic_checkpoint(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    cfg = tiny_train(max_steps=10, checkpoint_every=4, grad_accum=2, eval_every=5)
    train(tiny_model(), cfg, shakespeare_data, tmp_path / "straight", tokenizer=byte_tokenizer)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(tiny_model(), cfg, shakespeare_data, tmp_path / "crashed", CrashAt(7), tokenizer=byte_tokenizer)
    # steps 5..7 were logged after the step-4 checkpoint; the resumed run redoes them
    result = train(
        tiny_model(), cfg, shakespeare_data, tmp_path / "crashed", tokenizer=byte_tokenizer, resume=True
    )
    assert result.step == 10
    assert_bitwise_equal(tmp_path / "straight" / "final", tmp_path / "crashed" / "final")
    steps = [m["step"] for m in read_metrics(tmp_path / "crashed") if "train_loss" in m]
    assert steps == list(range(1, 11))  # no duplicated lines from the crashed attempt
    assert train_losses(tmp_path / "crashed") == train_losses(tmp_path / "straight")


def test_resume_from_an_explicit_folder_and_to_more_steps(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    first = train(tiny_model(), tiny_train(max_steps=4), shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    result = train(
        tiny_model(),
        tiny_train(max_steps=6),
        shakespeare_data,
        tmp_path,
        tokenizer=byte_tokenizer,
        resume=first.final_checkpoint,
    )
    assert result.step == 6 and result.stop_reason == "completed"


def test_resume_true_without_checkpoints_starts_fresh(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    result = train(
        tiny_model(),
        tiny_train(max_steps=2),
        shakespeare_data,
        tmp_path,
        tokenizer=byte_tokenizer,
        resume=True,
    )
    assert result.step == 2


def test_stop_right_after_resume_does_not_rewrite(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    cfg = tiny_train(max_steps=8)
    first = train(tiny_model(), cfg, shakespeare_data, tmp_path, StopAfter(2), tokenizer=byte_tokenizer)
    again = train(
        tiny_model(),
        cfg,
        shakespeare_data,
        tmp_path,
        StopAfter(0, "stop"),
        tokenizer=byte_tokenizer,
        resume=True,
    )
    assert again.stop_reason == "stop" and again.step == 2
    assert again.final_checkpoint == first.final_checkpoint
