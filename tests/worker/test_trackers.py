"""worker.integrations without training: a tracker that cannot start or breaks is turned off with
exactly one `warn` event (written to the real database) while the others go on with every step;
a tracker that hangs at the end costs at most tracker_finish_seconds; W&B missing or unconfigured
says so; the MLflow tracker sends the worker's credentials only to hosts allowed_tracker_hosts
lists, and refuses a host it does not list."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from core.models import Event
from tests.fixtures.service import make_job
from worker.integrations import warn_by_event
from worker.integrations.base import RunEnd, RunInfo, TrackedStep, Tracker, TrackerError
from worker.integrations.mlflow_tracker import MlflowTracker
from worker.integrations.trackers import Trackers
from worker.integrations.wandb_tracker import WandbTracker


class Recording(Tracker):
    kind = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, run: RunInfo) -> None:
        self.calls.append(("start", run.job_id))

    def log(self, steps: list[TrackedStep]) -> None:
        self.calls.append(("log", steps))

    def finish(self, end: RunEnd) -> None:
        self.calls.append(("finish", end))


class Breaking(Recording):
    kind = "breaking"

    def log(self, steps: list[TrackedStep]) -> None:
        super().log(steps)
        raise TrackerError("the server said no")


class Hanging(Recording):
    kind = "hanging"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def finish(self, end: RunEnd) -> None:
        self.release.wait(60)


@pytest.fixture
def job_id(settings: Any, session_factory: Any) -> str:
    return make_job(settings, session_factory, enqueue=False, status="running")


def run_info(job_id: str, tmp_path: Path) -> RunInfo:
    return RunInfo(
        job_id=job_id,
        model="llama-tiny",
        fine_tuned_model=f"ft:llama-tiny:{job_id}",
        config={"model": {"n_embd": 64}, "train": {"max_steps": 3}},
        hyperparameters={"max_steps": 3},
        start_step=0,
        work_dir=tmp_path,
    )


def warnings_of(session_factory: Any, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    with session_factory() as s:
        rows = s.execute(
            select(Event.message, Event.data)
            .where(Event.job_id == job_id, Event.level == "warn")
            .order_by(Event.seq)
        ).all()
        return [(m, d) for m, d in rows]


def drive(trackers: Trackers, job_id: str, tmp_path: Path) -> None:
    trackers.start(run_info(job_id, tmp_path))
    trackers.log(
        {1: {"train_loss": 2.0, "lr": 0.1, "val_loss": None}, 2: {"train_loss": 1.5, "grad_norm": None}}
    )
    trackers.log({2: {"val_loss": 1.75, "val_accuracy": 0.5}, 3: {"train_loss": float("inf")}})
    trackers.finish("succeeded", tmp_path)


def test_a_breaking_tracker_is_one_warning_and_the_others_get_every_step(
    job_id: str, session_factory: Any, tmp_path: Path
) -> None:
    good, bad = Recording(), Breaking()
    drive(Trackers([bad, good], warn_by_event(session_factory, job_id)), job_id, tmp_path)

    logged = [step for op, arg in good.calls if op == "log" for step in arg]
    assert logged == [
        (1, {"train_loss": 2.0, "learning_rate": 0.1}),
        (2, {"train_loss": 1.5}),
        (2, {"val_loss": 1.75, "val_accuracy": 0.5}),
    ]  # None and inf left out, a step with nothing left dropped
    assert good.calls[0] == ("start", job_id) and good.calls[-1][0] == "finish"
    end = good.calls[-1][1]
    assert end.status == "succeeded" and end.final_folder == tmp_path
    assert end.summary == {"train_loss": 1.5, "learning_rate": 0.1, "val_loss": 1.75, "val_accuracy": 0.5}
    assert [op for op, _ in bad.calls] == ["start", "log"]  # off after its first failure
    (warning,) = warnings_of(session_factory, job_id)
    assert warning[0] == "The breaking integration was turned off for this job: the server said no"
    assert warning[1] == {"integration": "breaking", "reason": "the server said no"}


def test_a_tracker_hanging_at_the_end_is_left_behind_with_one_warning(
    job_id: str, session_factory: Any, tmp_path: Path
) -> None:
    hanging = Hanging()
    trackers = Trackers([hanging], warn_by_event(session_factory, job_id), finish_seconds=0.5)
    try:
        drive(trackers, job_id, tmp_path)  # returns although the tracker's finish does not
        (warning,) = warnings_of(session_factory, job_id)
        assert "did not finish within 0.5 s" in warning[0] and warning[1]["integration"] == "hanging"
    finally:
        hanging.release.set()


def test_wandb_missing_or_unconfigured_says_so(
    job_id: str, session_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    drive(
        Trackers([WandbTracker({"project": "p"})], warn_by_event(session_factory, job_id)), job_id, tmp_path
    )
    monkeypatch.delitem(sys.modules, "wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    drive(
        Trackers([WandbTracker({"project": "p"})], warn_by_event(session_factory, job_id)), job_id, tmp_path
    )
    messages = [m for m, _ in warnings_of(session_factory, job_id)]
    assert len(messages) == 2
    assert messages[0].endswith("wandb is not installed on this worker")
    assert "wandb is not configured on this worker: set WANDB_API_KEY" in messages[1]
    assert "project 'p'" in messages[0]


@pytest.fixture
def fake_mlflow() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A real HTTP server on loopback answering every MLflow call with an MLflow-style error,
    recording each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            seen.append(dict(self.headers))
            body = json.dumps({"error_code": "PERMISSION_DENIED", "message": "no"}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer  # http.server's names

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_mlflow_credentials_go_only_to_listed_hosts(
    job_id: str,
    session_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_mlflow: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = fake_mlflow
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "sekrit")
    settings = {"tracking_uri": url, "experiment": "e"}

    drive(Trackers([MlflowTracker(settings, [])], warn_by_event(session_factory, job_id)), job_id, tmp_path)
    assert len(seen) == 1 and "Authorization" not in seen[0]  # any host allowed: no credentials
    drive(
        Trackers([MlflowTracker(settings, ["127.0.0.1"])], warn_by_event(session_factory, job_id)),
        job_id,
        tmp_path,
    )
    assert len(seen) == 2 and seen[1]["Authorization"] == "Bearer sekrit"
    drive(
        Trackers([MlflowTracker(settings, ["mlflow.internal"])], warn_by_event(session_factory, job_id)),
        job_id,
        tmp_path,
    )
    assert len(seen) == 2  # not called at all

    messages = [m for m, _ in warnings_of(session_factory, job_id)]
    assert len(messages) == 3
    assert messages[0].endswith(
        "the MLflow server answered 403 to experiments/get-by-name: PERMISSION_DENIED: no"
    ), messages[0]
    assert messages[2].endswith("this worker's allowed_tracker_hosts does not list the tracking_uri's host")
