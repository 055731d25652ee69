"""Stopping at the best: a run whose validation loss rises stops after `early_stopping_patience`
evaluations without a new best, and its model (final/) is the best evaluation's weights; a resumed
run stops at the same step with the same tensors, and so do two processes (ddp, fsdp); the CLI's
final/, exports and samples come from that model.

The data: the start of tiny Shakespeare to train on, digits to validate on. Learning English first
helps on digits too (common byte statistics), then hurts: the validation loss falls until about
step 8 and rises from there (float32 on CPU, so the same every run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import SHAKESPEARE, read_metrics, train_losses
from tests.trainer.test_cli import TINY, fromscratch
from tests.trainer.test_cli_exports import onnx_logits_match_checkpoint
from tests.trainer.test_distributed import MODEL, assert_same_run
from tests.trainer.test_loop import Recorder
from tests.trainer.test_resume import StopAfter, assert_bitwise_equal
from trainer.config import ConfigError, ModelConfig, TrainConfig
from trainer.distributed.launch import launch_train
from trainer.run.loop import TrainResult, train

EVERY, PATIENCE = 2, 3


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("data")
    (folder / "train.txt").write_text(SHAKESPEARE.read_text()[:20_000])
    (folder / "val.txt").write_text("0123456789" * 400)
    return folder / "train.txt", folder / "val.txt"


def run(tiny_model: Any, cfg: TrainConfig, files: tuple[Path, Path], out: Path, **kw: Any) -> TrainResult:
    return train(tiny_model(), cfg, files[0], out, validation_path=files[1], **kw)


def config(tiny_train: Any, **kw: Any) -> TrainConfig:
    values = dict(max_steps=40, eval_every=EVERY, early_stopping_patience=PATIENCE, tokenizer="byte")
    return tiny_train(**{**values, **kw})


def model_tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_model(a: Path, b: Path) -> None:
    ta, tb = model_tensors(a), model_tensors(b)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def val_losses(out: Path) -> list[tuple[int, float]]:
    return [(m["step"], m["val_loss"]) for m in read_metrics(out) if "val_loss" in m]


def test_a_rising_validation_loss_stops_the_run_and_the_model_is_the_best(
    tmp_path, tiny_model, tiny_train, files
):
    rec = Recorder()
    result = run(tiny_model, config(tiny_train), files, tmp_path, callbacks=rec)
    losses = val_losses(tmp_path)
    best_step, best_loss = min(losses, key=lambda s: s[1])
    assert 2 < best_step < 20  # the loss fell, then rose
    assert result.stop_reason == "early_stop"
    assert result.step == best_step + PATIENCE * EVERY and losses[-1][0] == result.step
    assert (result.best_step, result.best_val_loss, result.evals_since_best) == (
        best_step,
        best_loss,
        PATIENCE,
    )
    # final/ is the model: best/'s weights; the last step's state is kept for --resume
    assert result.final_checkpoint == tmp_path / "final" and result.model_step == best_step
    assert_same_model(tmp_path / "final", tmp_path / "best")
    assert json.loads((tmp_path / "final" / "state.json").read_text())["step"] == best_step
    last = tmp_path / "checkpoints" / f"step-{result.step:08d}"
    assert rec.checkpoints == [(result.step, last)]
    assert not all(
        torch.equal(t, model_tensors(last)[k]) for k, t in model_tensors(tmp_path / "final").items()
    )
    # the full validation pass measures the model, at its step
    assert [s for s, _, _ in rec.full_evals] == [best_step] and result.full_valid_loss is not None
    assert result.model_note == (
        f"Validation loss has not improved for {PATIENCE} evaluations since step {best_step} "
        f"({best_loss:.3f}); stopping; the model is the step-{best_step} checkpoint. To train longer, "
        "raise early_stopping_patience (0 = off)"
    )


def test_a_resumed_run_stops_at_the_same_step_with_the_same_model(tmp_path, tiny_model, tiny_train, files):
    cfg = config(tiny_train)
    straight = run(tiny_model, cfg, files, tmp_path / "straight")
    # paused after the best, with evaluations since it counted: the count must survive the checkpoint
    first = run(
        tiny_model, cfg, files, tmp_path / "resumed", callbacks=StopAfter(straight.best_step + EVERY + 1)
    )
    assert first.stop_reason == "pause" and first.evals_since_best == 1
    second = run(tiny_model, cfg, files, tmp_path / "resumed", resume=True)
    assert (second.stop_reason, second.step, second.best_step) == (
        "early_stop",
        straight.step,
        straight.best_step,
    )
    assert_bitwise_equal(tmp_path / "straight" / "final", tmp_path / "resumed" / "final")
    last = f"checkpoints/step-{straight.step:08d}"
    assert_bitwise_equal(tmp_path / "straight" / last, tmp_path / "resumed" / last)
    assert val_losses(tmp_path / "resumed") == val_losses(tmp_path / "straight")


def test_resuming_a_stopped_run_stops_again_unless_patience_changes(tmp_path, tiny_model, tiny_train, files):
    first = run(tiny_model, config(tiny_train), files, tmp_path)
    again = run(tiny_model, config(tiny_train), files, tmp_path, resume=True)
    assert (again.stop_reason, again.step) == ("early_stop", first.step)  # not a step more
    assert_same_model(tmp_path / "final", tmp_path / "best")
    longer = run(tiny_model, config(tiny_train, early_stopping_patience=0), files, tmp_path, resume=True)
    assert (longer.stop_reason, longer.step) == ("completed", 40)


def test_a_run_that_ends_past_its_best_has_the_best_as_its_model(tmp_path, tiny_model, tiny_train, files):
    rec = Recorder()
    result = run(
        tiny_model,
        config(tiny_train, max_steps=16, early_stopping_patience=0),
        files,
        tmp_path,
        callbacks=rec,
    )
    assert result.stop_reason == "completed" and result.step == 16
    assert result.model_step == result.best_step < 16 and result.evals_since_best > PATIENCE
    assert_same_model(tmp_path / "final", tmp_path / "best")
    assert rec.checkpoints == [(16, tmp_path / "checkpoints" / "step-00000016")]  # kept for --resume
    assert result.model_note is not None and result.model_note.startswith(
        f"Validation loss was lowest at step {result.best_step} "
    )


def test_min_delta_a_new_best_must_beat_the_best_by_more(tmp_path, tiny_model, tiny_train, files):
    # no later evaluation is 1 nat below the first: it stays the best
    result = run(tiny_model, config(tiny_train, early_stopping_min_delta=1.0), files, tmp_path)
    assert (result.stop_reason, result.best_step, result.step) == (
        "early_stop",
        EVERY,
        EVERY + PATIENCE * EVERY,
    )
    assert val_losses(tmp_path)[1][1] < val_losses(tmp_path)[0][1]  # improved, but by less than 1
    assert_same_model(tmp_path / "final", tmp_path / "best")


def test_a_run_at_its_best_keeps_the_last_step_as_its_model(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    result = train(
        tiny_model(),
        tiny_train(max_steps=6, eval_every=3, early_stopping_patience=2),
        shakespeare_data,
        tmp_path,
        tokenizer=byte_tokenizer,
    )
    assert (result.stop_reason, result.best_step, result.model_step, result.model_note) == (
        "completed",
        6,
        6,
        None,
    )
    assert not (tmp_path / "checkpoints").exists()


def test_patience_needs_evaluations(tiny_train):
    with pytest.raises(ConfigError) as err:
        tiny_train(eval_every=0, early_stopping_patience=3)
    assert err.value.problems[0][0] == "early_stopping_patience"
    assert tiny_train(eval_every=0, early_stopping_patience=0).resolved_early_stopping_patience == 0
    assert tiny_train(eval_every=5).resolved_early_stopping_patience == 0  # auto: off for now


@pytest.mark.parametrize("eval_every", [1, None])  # None: auto, which finds nothing to evaluate
def test_patience_without_validation_data_is_a_note(
    eval_every, tmp_path, tiny_model, tiny_train, shakespeare
):
    rec = Recorder()
    cfg = tiny_train(
        max_steps=2, warmup_steps=0, eval_every=eval_every, val_fraction=0.0, early_stopping_patience=3
    )
    result = train(tiny_model(), cfg, shakespeare, tmp_path, rec)
    assert result.stop_reason == "completed"
    assert rec.started is not None and len(rec.started["notes"]) == 1
    assert rec.started["notes"][0].startswith(
        "early_stopping_patience 3 does nothing in this run: it has no "
    )


def test_cli_final_and_exports_are_the_best(tmp_path, files):
    out = tmp_path / "run"
    common = ["--out", out, "--validation-file", files[1], "--samples", "1"]
    options = [*TINY, "--max-steps", "40", "--eval-every", "2", "--eval-batches", "2", "--seed", "1337"]
    r = fromscratch(
        "train", files[0], *common, *options, "--early-stopping-patience", "3", "--export-formats", "onnx"
    )
    assert r.returncode == 0, r.stderr
    best_step = json.loads((out / "best" / "state.json").read_text())["step"]
    assert f"the model is the step-{best_step} checkpoint" in r.stdout and "--- sample 1 ---" in r.stdout
    assert_same_model(out / "final", out / "best")
    onnx_logits_match_checkpoint(out / "exports" / "model.onnx", out / "best")
    # --resume continues from the last step (a checkpoint), not from final/
    r = fromscratch(
        "train",
        files[0],
        "--out",
        out,
        "--resume",
        "--validation-file",
        files[1],
        "--early-stopping-patience",
        "0",
        "--max-steps",
        "30",
        "--samples",
        "0",
    )
    assert r.returncode == 0, r.stderr
    assert "resuming from " + str(out / "checkpoints") in r.stdout and "completed at step 30" in r.stdout


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_processes_stop_at_the_step_one_process_stops_at(tmp_path, files, monkeypatch, sharding):

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks inherit it; the machine has 2 cores
    common = dict(
        max_steps=40, batch_size=2, eval_every=EVERY, eval_batches=2, early_stopping_patience=PATIENCE
    )
    common |= dict(learning_rate=3e-3, warmup_steps=2, checkpoint_every=0, device="cpu", dtype="float32")
    one = train(
        ModelConfig(**MODEL),
        TrainConfig(**common, grad_accum=2),
        files[0],
        tmp_path / "one",
        validation_path=files[1],
    )
    two = launch_train(
        ModelConfig(**MODEL),
        TrainConfig(**common, devices=2, sharding=sharding),
        files[0],
        tmp_path / "two",
        validation_path=files[1],
    )
    assert one.stop_reason == two.stop_reason == "early_stop"
    assert (two.step, two.best_step, two.model_step) == (one.step, one.best_step, one.best_step)
    assert_same_run(
        train_losses(tmp_path / "two"),
        train_losses(tmp_path / "one"),
        two.final_checkpoint,
        one.final_checkpoint,
    )
