"""trainer.distributed.callback_relay: rank 0 of a distributed run calls callbacks that live in the launching
process (the worker's), in order, with their answers and errors; and trainer.distributed.launch's
handling of ranks that die: RankLost for a killed rank, no rank outliving a killed launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import pytest

from tests.fixtures.processes import running, spawned_ranks
from tests.trainer.conftest import SHAKESPEARE
from tests.trainer.test_distributed import MODEL, REPO, two_ranks
from trainer.config import ModelConfig
from trainer.config.metrics import StepMetrics
from trainer.distributed.callback_relay import CallbackRelay, RelayedCallbackError
from trainer.distributed.launch import RankLost, launch_train
from trainer.run.report import Callbacks
from trainer.run.state import StartInfo


@pytest.fixture(autouse=True)
def one_thread_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


class Recorder(Callbacks):
    """Lives in the test process: what rank 0 reported, and a pause from the 6th stop check on."""

    def __init__(self) -> None:
        self.starts: list[StartInfo] = []
        self.steps: list[int] = []
        self.checkpoints: list[tuple[int, Path]] = []
        self.checks = 0

    def on_start(self, info: StartInfo) -> None:
        self.starts.append(info)

    def on_step(self, metrics: StepMetrics) -> None:
        self.steps.append(metrics.step)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.checkpoints.append((step, path))

    def should_stop(self) -> Literal["stop", "pause"] | None:
        self.checks += 1
        return "pause" if self.checks >= 6 else None


def test_rank_zero_reports_to_callbacks_in_the_launching_process(tmp_path: Path) -> None:
    recorder = Recorder()
    with CallbackRelay(recorder) as relay:
        result = launch_train(
            ModelConfig(**MODEL), two_ranks(max_steps=50), SHAKESPEARE, tmp_path, relay.factory
        )
    relay.raise_error()  # none
    assert [info["processes"] for info in recorder.starts] == [2]
    # one check before the first step, one per logged step: the 6th check stops after step 5
    assert result.stop_reason == "pause" and result.step == 5
    assert recorder.steps == [1, 2, 3, 4, 5]
    assert recorder.checkpoints == [(5, tmp_path / "checkpoints" / "step-00000005")]


class Failing(Callbacks):
    def on_step(self, metrics: StepMetrics) -> None:
        raise LookupError("the database is gone")


def test_a_callbacks_error_reaches_the_launching_process_as_raised(tmp_path: Path) -> None:
    with CallbackRelay(Failing()) as relay, pytest.raises(RelayedCallbackError, match="LookupError"):
        launch_train(ModelConfig(**MODEL), two_ranks(max_steps=5), SHAKESPEARE, tmp_path, relay.factory)
    with pytest.raises(LookupError, match="the database is gone"):
        relay.raise_error()


class KillSelfAtStep3(Callbacks):
    """Made in rank 0: SIGKILLs it (as the OOM killer would) in the middle of the run."""

    def on_step(self, metrics: StepMetrics) -> None:
        if metrics.step == 3:
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_rank_raises_rank_lost_not_the_other_ranks_errors(tmp_path: Path) -> None:
    with pytest.raises(RankLost) as err:
        launch_train(ModelConfig(**MODEL), two_ranks(max_steps=50), SHAKESPEARE, tmp_path, KillSelfAtStep3)
    assert (err.value.rank, err.value.world, err.value.how) == (0, 2, "SIGKILL")
    assert str(err.value) == "training process 0 of 2 died (SIGKILL)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--ctx", "32", "--batch-size", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "train", str(SHAKESPEARE), "--out", str(tmp_path / "o"), *tiny]
        + ["--devices", "2", "--device", "cpu", "--max-steps", "100000", "--samples", "0"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        metrics = tmp_path / "o" / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.exists() and metrics.read_text().count("train_loss") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.2)
        ranks = spawned_ranks(proc.pid)
        assert len(ranks) == 2
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(running(r) for r in ranks):
            assert time.monotonic() < deadline, "a rank outlived its launcher"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
