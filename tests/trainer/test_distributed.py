"""Data-parallel training (trainer.distributed.launch): two gloo processes on the CPU train exactly what one
process with twice the gradient accumulation trains, only rank 0 writes, every rank stops at the
step rank 0 decides, and checkpoints resume across world sizes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import SHAKESPEARE, read_metrics, train_losses
from trainer.config import ConfigError, ModelConfig, TrainConfig
from trainer.config.metrics import StepMetrics
from trainer.distributed.launch import launch_train
from trainer.run.loop import train
from trainer.run.report import Callbacks

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
MODEL = dict(n_layer=1, n_head=2, n_embd=32, ctx=32, vocab_size=258)
TRAIN: dict[str, Any] = dict(
    max_steps=STEPS,
    batch_size=2,
    learning_rate=3e-3,
    warmup_steps=2,
    eval_every=10,
    eval_batches=2,
    checkpoint_every=10,
    device="cpu",
    dtype="float32",
    export_formats=[],
)


@pytest.fixture(autouse=True)
def one_thread_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks inherit it; the machine has 2 cores


def two_ranks(**kw: Any) -> TrainConfig:
    return TrainConfig(**{**TRAIN, "devices": 2, "grad_accum": 1, **kw})


def one_process(**kw: Any) -> TrainConfig:
    """The single-process run with the same global batch (2 x 1 x 2 = 2 x 2 x 1 windows)."""
    return TrainConfig(**{**TRAIN, "devices": 1, "grad_accum": 2, **kw})


class StopOnCall(Callbacks):
    """should_stop answers `reason` from its n-th call on. A run calls it once before the first step
    and once per (logged) step after that, so the 11th call stops a run after step 10, in one
    process and in several alike. Picklable by reference: only rank 0 makes one."""

    def __init__(self, n: int = 11, reason: Literal["stop", "pause"] = "stop") -> None:
        self.n, self.reason, self.calls, self.steps = n, reason, 0, []

    def on_step(self, metrics: StepMetrics) -> None:
        self.steps.append(metrics.step)

    def should_stop(self) -> Literal["stop", "pause"] | None:
        self.calls += 1
        return self.reason if self.calls >= self.n else None


class PauseAfterTen(StopOnCall):
    def __init__(self) -> None:
        super().__init__(11, "pause")


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def assert_same_run(losses: list[float], expected: list[float], final: Path, expected_final: Path) -> None:
    assert len(losses) == len(expected)
    for got, want in zip(losses, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-5)
    mine, theirs = weights(final), weights(expected_final)
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-process run and its 1-process equivalent, 30 steps each (shared by the tests below)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = tmp_path_factory.mktemp("ddp")
    model = ModelConfig(**MODEL)
    two = launch_train(model, two_ranks(), SHAKESPEARE, root / "two")
    one = train(model, one_process(), SHAKESPEARE, root / "one")
    return {"root": root, "two": two, "one": one}


def test_two_processes_train_what_one_process_accumulating_twice_trains(runs: dict[str, Any]) -> None:
    root, two, one = runs["root"], runs["two"], runs["one"]
    assert two.stop_reason == one.stop_reason == "completed" and two.step == one.step == STEPS
    assert two.tokens_seen == one.tokens_seen == STEPS * 4 * 32  # the global batch, not one rank's
    assert_same_run(
        train_losses(root / "two"), train_losses(root / "one"), two.final_checkpoint, one.final_checkpoint
    )
    val = [[m["val_loss"] for m in read_metrics(root / run) if "val_loss" in m] for run in ("two", "one")]
    assert len(val[0]) == 3 and val[0] == pytest.approx(val[1], rel=1e-5)
    assert two.full_valid_loss == pytest.approx(one.full_valid_loss, rel=1e-5)


@pytest.mark.parametrize(
    ("sharding", "dropout"), [("ddp", 0.0), ("fsdp", 0.0), ("ddp", 0.3)], ids=["ddp", "fsdp", "ddp-dropout"]
)
def test_accumulation_inside_each_rank_keeps_the_single_process_order(
    tmp_path: Path, sharding: Literal["ddp", "fsdp"], dropout: float
) -> None:
    """2 ranks x grad_accum 2 (gradient sync skipped in the first micro-batch) = 1 process x 4; with
    dropout, each rank's micro-batches draw the masks of their place in the global batch
    (trainer.run.step.DropoutSeeds), not the same masks on every rank."""
    model = ModelConfig(**MODEL)
    short = dict(batch_size=1, max_steps=6, eval_every=0, checkpoint_every=0, dropout=dropout)
    two = launch_train(
        model, two_ranks(grad_accum=2, sharding=sharding, **short), SHAKESPEARE, tmp_path / "2"
    )
    one = train(model, one_process(grad_accum=4, **short), SHAKESPEARE, tmp_path / "1")
    assert_same_run(
        train_losses(tmp_path / "2"), train_losses(tmp_path / "1"), two.final_checkpoint, one.final_checkpoint
    )


def test_only_rank_zero_writes(runs: dict[str, Any]) -> None:
    out = runs["root"] / "two"
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics if "train_loss" in m] == list(range(1, STEPS + 1))  # each step once
    assert [m["step"] for m in metrics if "val_loss" in m] == [10, 20, 30]
    assert sum("full_valid_loss" in m for m in metrics) == 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000010", "step-00000020"]
    assert sorted(p.name for p in out.iterdir()) == ["best", "cache", "checkpoints", "final", "metrics.jsonl"]
    assert not list(out.rglob("*.tmp*"))  # no writer raced another


def test_every_rank_stops_at_the_step_rank_zero_decides_and_resumes_in_one_process(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    model, out = ModelConfig(**MODEL), tmp_path / "two-then-one"
    stopped = launch_train(model, two_ranks(), SHAKESPEARE, out, StopOnCall)
    assert stopped.stop_reason == "stop" and stopped.step == 10  # launch returned: every rank left
    assert stopped.final_checkpoint == out / "checkpoints" / "step-00000010"
    assert [m["step"] for m in read_metrics(out) if "train_loss" in m] == list(range(1, 11))

    resumed = train(model, one_process(), SHAKESPEARE, out, resume=True)
    assert resumed.stop_reason == "completed" and resumed.step == STEPS
    ref = runs["root"] / "one"
    assert_same_run(
        train_losses(out), train_losses(ref), resumed.final_checkpoint, runs["one"].final_checkpoint
    )


def test_a_one_process_checkpoint_resumes_in_two_processes(runs: dict[str, Any], tmp_path: Path) -> None:
    model, out = ModelConfig(**MODEL), tmp_path / "one-then-two"
    paused = train(model, one_process(), SHAKESPEARE, out, PauseAfterTen())
    assert paused.stop_reason == "pause" and paused.step == 10

    resumed = launch_train(model, two_ranks(), SHAKESPEARE, out, resume=True)
    assert resumed.stop_reason == "completed" and resumed.step == STEPS
    ref = runs["root"] / "one"
    assert_same_run(
        train_losses(out), train_losses(ref), resumed.final_checkpoint, runs["one"].final_checkpoint
    )


def test_fsdp_trains_what_one_process_trains_and_writes_our_checkpoints(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "fsdp"
    result = launch_train(ModelConfig(**MODEL), two_ranks(sharding="fsdp"), SHAKESPEARE, out)
    assert result.stop_reason == "completed" and result.step == STEPS
    ref = runs["root"] / "one"
    assert_same_run(
        train_losses(out), train_losses(ref), result.final_checkpoint, runs["one"].final_checkpoint
    )
    # the gathered optimizer state is the whole one, in our safetensors format
    mine = load_file(str(result.final_checkpoint / "optimizer.safetensors"))
    theirs = load_file(str(runs["one"].final_checkpoint / "optimizer.safetensors"))
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-4, atol=1e-6, msg=name)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000010", "step-00000020"]
    assert [m["step"] for m in read_metrics(out) if "val_loss" in m] == [10, 20, 30]  # rank 0 reports


def test_fsdp_resumes_a_one_process_checkpoint_and_one_process_resumes_its_checkpoint(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    model, out = ModelConfig(**MODEL), tmp_path / "one-fsdp-one"
    assert train(model, one_process(), SHAKESPEARE, out, PauseAfterTen()).step == 10
    sharded = launch_train(model, two_ranks(sharding="fsdp"), SHAKESPEARE, out, StopOnCall, resume=True)
    assert sharded.stop_reason == "stop" and sharded.step == 20  # 10 steps after resuming
    resumed = train(model, one_process(), SHAKESPEARE, out, resume=True)
    assert resumed.step == STEPS
    ref = runs["root"] / "one"
    assert_same_run(
        train_losses(out), train_losses(ref), resumed.final_checkpoint, runs["one"].final_checkpoint
    )


def test_pause_is_agreed_by_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "paused"
    result = launch_train(ModelConfig(**MODEL), two_ranks(max_steps=12), SHAKESPEARE, out, PauseAfterTen)
    assert result.stop_reason == "pause" and result.step == 10
    assert (out / "checkpoints" / "step-00000010" / "state.json").exists()
    assert not (out / "final").exists()


def test_rank_zeros_time_limit_ends_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "timed"
    result = launch_train(ModelConfig(**MODEL), two_ranks(max_steps=10_000, time_limit=0.5), SHAKESPEARE, out)
    assert result.stop_reason == "time_limit" and result.step < 10_000  # rank 0 decided, all left
    # it ends as a model: final/, and its last step's checkpoint to resume from
    assert result.final_checkpoint == out / "final" and result.model_step == result.step
    assert (out / "checkpoints" / f"step-{result.step:08d}" / "state.json").exists()
    assert [m["step"] for m in read_metrics(out) if "train_loss" in m] == list(range(1, result.step + 1))


def test_a_rank_error_is_raised_by_the_launcher(tmp_path: Path) -> None:
    empty = tmp_path / "tiny.txt"
    empty.write_text("too short")
    from trainer.data.errors import DataError

    with pytest.raises(DataError, match="too few for one window"):
        launch_train(ModelConfig(**MODEL), two_ranks(), empty, tmp_path / "o")


def test_the_global_batch_sets_steps_per_epoch_and_tokens() -> None:
    from trainer.config.estimate import global_batch, total_steps, total_tokens

    two, one = two_ranks(max_steps=None, n_epochs=1), one_process(max_steps=None, n_epochs=1)
    assert global_batch(two) == global_batch(one) == 4
    assert total_steps(two, 100) == total_steps(one, 100) == 25
    assert total_tokens(two, 32, 10) == total_tokens(one, 32, 10) == 10 * 4 * 32


def test_config_refusals() -> None:
    with pytest.raises(ConfigError) as err:
        two_ranks(sharding="fsdp", dtype="float16")
    assert err.value.param == "dtype" and "bfloat16" in str(err.value)
    with pytest.raises(ConfigError, match="64 processes need 64 CUDA devices") as err:
        launch_train(ModelConfig(**MODEL), two_ranks(devices=64, device="cuda"), SHAKESPEARE, Path("/none"))
    assert err.value.param == "devices"
    with pytest.raises(ValueError, match="launch_train"):  # devices 2 needs the launcher
        train(ModelConfig(**MODEL), two_ranks(), SHAKESPEARE, Path("/nonexistent"))


@pytest.mark.cuda(devices=2)
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_gpus_with_nccl_train_what_one_gpu_accumulating_twice_trains(
    tmp_path: Path, sharding: Literal["ddp", "fsdp"]
) -> None:
    model = ModelConfig(**MODEL)
    cuda = dict(device="cuda", dtype="float32", max_steps=10, eval_every=5, checkpoint_every=0)
    two = launch_train(model, two_ranks(sharding=sharding, **cuda), SHAKESPEARE, tmp_path / "two")
    one = train(model, one_process(**cuda), SHAKESPEARE, tmp_path / "one")
    assert two.step == one.step == 10
    # TF32 matmuls on CUDA: equal up to their rounding, not to float32's
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-2)


def test_cli_trains_with_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--ctx", "32", "--batch-size", "2"]
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "train", str(SHAKESPEARE), "--out", str(out), *tiny]
        + ["--devices", "2", "--device", "cpu", "--max-steps", "4", "--eval-every", "2", "--samples", "1"]
        + ["--export-formats", "none"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "completed at step 4" in r.stdout and "--- sample 1 ---" in r.stdout
    assert r.stdout.count("step 4/4") == 1  # rank 0 alone shows the progress
    assert [m["step"] for m in read_metrics(out) if "train_loss" in m] == [1, 2, 3, 4]
    assert (out / "final" / "model.safetensors").exists()


def test_ctrl_c_stops_a_cli_run_with_a_checkpoint(tmp_path: Path) -> None:
    """SIGINT to the terminal's process group: the launcher and rank 1 ignore it, rank 0's progress
    callbacks stop the run, every rank agrees, and the CLI reports the stop and its checkpoint and
    exits 130 saying how to continue."""
    out = tmp_path / "interrupted"
    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--ctx", "32", "--batch-size", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "train", str(SHAKESPEARE), "--out", str(out), *tiny]
        + ["--devices", "2", "--device", "cpu", "--max-steps", "100000", "--samples", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and f"--out {out} --resume" in stderr, stderr  # stopped short: resumable
    steps = [m["step"] for m in read_metrics(out) if "train_loss" in m]
    assert steps == list(range(1, len(steps) + 1))
    assert f"stop at step {steps[-1]}" in stdout
    assert (out / "checkpoints" / f"step-{steps[-1]:08d}" / "state.json").exists()
