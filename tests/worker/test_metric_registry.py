"""The metric registry (trainer/config/metrics.py) is the only table of metric names: a value of each
metric, reported through the service's callbacks, lands in metrics.jsonl, its Metric row, the job's
progress, checkpoint metrics, events, GET /metrics, the SSE stream, the results CSV, TensorBoard and
the trackers (their run summary included) under the name the registry gives it there."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import secrets
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.main import create_app
from api.tensorboard_events import step_scalars
from core.blobstore import blobstore_from_settings
from core.job_leases import claim_job
from core.jobstates import transition
from core.keys import create_key
from core.models import Job, Metric
from core.settings import Settings
from tests.fixtures.service import make_job
from trainer.config.metrics import (
    BY_NAME,
    METRICS,
    STORED,
    EvalMetrics,
    FullEvalMetrics,
    Measured,
    StepMetrics,
    of_phase,
)
from trainer.run.metrics_file import MetricsFile
from worker.integrations.base import RunEnd, RunInfo, TrackedStep, Tracker, summarize
from worker.integrations.callbacks import TrackedCallbacks
from worker.integrations.trackers import Trackers
from worker.result_file import csv_chunks

WORKER = "w-registry"
STEP = 7
# a distinct value per metric (integers: tokens_seen is one, and each reads back exactly)
VALUE: dict[str, Any] = {spec.name: 10 + i for i, spec in enumerate(METRICS)}


class Recording(Tracker):
    kind = "recording"

    def __init__(self) -> None:
        self.logged: list[TrackedStep] = []
        self.end: RunEnd | None = None

    def start(self, run: RunInfo) -> None:
        pass

    def log(self, steps: list[TrackedStep]) -> None:
        self.logged += steps

    def finish(self, end: RunEnd) -> None:
        self.end = end


def measured(cls: type[Measured], step: int = STEP) -> Any:
    """`cls` (a phase's dataclass) holding VALUE for each metric it is given (not those it derives)."""
    given = {f.name: VALUE[f.name] for f in dataclasses.fields(cls) if f.init and f.name != "step"}
    return cls(step=step, **given)


def test_every_stored_metric_is_a_metric_column() -> None:
    assert {spec.name for spec in STORED} <= set(Metric.__table__.columns.keys())


def test_metrics_jsonl_names_each_metric_by_its_registry_name(tmp_path: Path) -> None:
    out = MetricsFile(tmp_path / "metrics.jsonl", keep_upto=None)
    for cls in (StepMetrics, EvalMetrics, FullEvalMetrics):
        out.write(measured(cls))
    out.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for record, phase in zip(records, ("step", "eval", "full_eval"), strict=True):
        assert set(record) == {"step", "time", *(spec.name for spec in of_phase(phase))}
        assert all(
            record[spec.name] == VALUE[spec.name] for spec in of_phase(phase) if spec.name != "val_ppl"
        )


def test_a_run_summary_holds_the_last_value_or_the_highest_of_a_max_metric() -> None:
    summary: dict[str, float] = {}
    summarize(summary, [(1, {"train_loss": 2.0, "peak_memory_bytes": 5e8})])
    summarize(summary, [(2, {"train_loss": 1.5, "peak_memory_bytes": 3e8}), (3, {"train_loss": 1.25})])
    assert summary == {"train_loss": 1.25, "peak_memory_bytes": 5e8}


def _callbacks(
    settings: Settings,
    session_factory: sessionmaker[Session],
    job_id: str,
    tmp_path: Path,
    trackers: Trackers,
) -> TrackedCallbacks:
    return TrackedCallbacks(
        session_factory,
        blobstore_from_settings(settings, session_factory),
        job_id=job_id,
        worker_id=WORKER,
        checkpoint_model_id=lambda s: f"ckpt-{s}",
        scratch=tmp_path,
        flush_seconds=0.0,
        keep_checkpoints=None,
        db_retry_seconds=5.0,
        trackers=trackers,
    )


def _report(settings: Settings, session_factory: sessionmaker[Session], job_id: str, tmp_path: Path) -> Any:
    """One step, evaluation and full pass through the service's callbacks; returns
    (the checkpoint metrics of that step, the recording tracker)."""
    tracker = Recording()
    trackers = Trackers([tracker], lambda t, reason: None)
    trackers.start(RunInfo(job_id, "llama-tiny", "ft:x", {}, {}, 0, tmp_path))
    cb = _callbacks(settings, session_factory, job_id, tmp_path, trackers)
    cb.on_step(measured(StepMetrics))
    cb.on_eval(measured(EvalMetrics))
    cb.on_full_eval(measured(FullEvalMetrics))
    cb.flush(wait=True)
    trackers.finish("cancelled", None)
    return cb.checkpoint_metrics(STEP), tracker


def test_each_metric_reaches_every_table_under_its_registry_name(
    settings: Settings, session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    owner = f"owner-{secrets.token_hex(6)}"
    job_id = make_job(settings, session_factory, owner_id=owner, enqueue=False, status="queued")
    with session_factory() as s:
        _, secret = create_key(s, "registry-test", owner_id=owner)
        s.commit()
        assert claim_job(s, job_id, WORKER, lease_seconds=600) is not None
    checkpoint, tracker = _report(settings, session_factory, job_id, tmp_path)
    # the reported metrics; the system ones are sampled by the worker at the flush (their own test:
    # tests/worker/test_system_metrics.py), so their values here are this process's
    stored = {spec.name: VALUE[spec.name] for spec in STORED if spec.phase != "system"}
    system = [spec.name for spec in STORED if spec.phase == "system"]

    with session_factory() as s:
        row = s.get(Metric, (job_id, STEP))
        job = s.get(Job, job_id)
        assert row is not None and job is not None
        assert {name: getattr(row, name) for name in stored} == stored
        assert row.cpu_percent is not None and row.rss_bytes is not None and len(system) == 4
        # the job shows the newest value of each, except tokens/s: the smoothed rate, none before a
        # measured interval (trainer.config.throughput.StepRate; its own tests)
        copied = [spec for spec in STORED if spec.progress and spec.name != "tokens_per_s"]
        assert {spec.progress: getattr(job, spec.progress) for spec in copied} == {
            spec.progress: VALUE[spec.name] for spec in copied
        }
        assert dict(step_scalars(row)) == {
            spec.tensorboard: VALUE[spec.name] for spec in STORED if spec.tensorboard and spec.name in stored
        }
        table = list(csv.DictReader(io.BytesIO(b"".join(csv_chunks(s, job_id))).read().decode().splitlines()))
        transition(s, job, "cancelled")  # a finished job's stream sends its newest row and ends
        s.commit()
    assert {spec.csv: float(table[0][spec.csv]) for spec in STORED if spec.csv} == {
        spec.csv: VALUE[spec.name] for spec in STORED if spec.csv and spec.name in stored
    }
    assert checkpoint == {
        "step": STEP,
        **{spec.openai: VALUE[spec.name] for spec in METRICS if spec.checkpoint},
    }
    tracked = {spec.tracker: VALUE[spec.name] for spec in STORED if spec.tracker and spec.name in stored}
    assert {step for step, _ in tracker.logged} == {STEP}  # in one log call or several flushes
    assert {name: value for _, values in tracker.logged for name, value in values.items()} == tracked
    assert tracker.end is not None and tracker.end.summary == tracked

    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {secret}"}
        url = f"/v1/fine_tuning/jobs/{job_id}"
        (point,) = client.get(f"{url}/metrics", headers=headers).json()["data"]
        assert {name: point[name] for name in stored} == stored
        events = client.get(f"{url}/events?limit=100", headers=headers).json()["data"]
        (data,) = [e["data"] for e in events if e["type"] == "metrics"]
        assert set(data) == {"step", *(spec.openai for spec in STORED)}
        assert {k: data[k] for k in ("step", *(BY_NAME[n].openai for n in stored))} == {
            "step": STEP,
            **{BY_NAME[n].openai: v for n, v in stored.items()},
        }
        full = [e["data"] for e in events if e["message"].startswith("Full validation")]
        assert full == [{"step": STEP, **{spec.openai: VALUE[spec.name] for spec in of_phase("full_eval")}}]
        with client.stream("GET", f"{url}/stream", headers=headers) as r:
            frames = r.read().decode().split("\n\n")
    sent = [json.loads(f.split("data: ", 1)[1]) for f in frames if f.startswith("event: metrics")]
    assert [{name: p[name] for name in stored} for p in sent] == [stored]


def test_a_checkpoint_between_evaluations_has_no_validation_metrics(
    settings: Settings, session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    """A pause's checkpoint 5 steps after the last evaluation: its train loss is its step's, and it has
    no valid_loss rather than the older evaluation's; the evaluated step's own checkpoint keeps it."""
    job_id = make_job(settings, session_factory, enqueue=False, status="queued")
    with session_factory() as s:
        assert claim_job(s, job_id, WORKER, lease_seconds=600) is not None
        s.commit()
    cb = _callbacks(settings, session_factory, job_id, tmp_path, Trackers([], lambda t, reason: None))
    cb.on_step(measured(StepMetrics))
    cb.on_eval(measured(EvalMetrics))
    assert cb.checkpoint_metrics(STEP)["valid_loss"] == VALUE["val_loss"]
    later = dataclasses.replace(measured(StepMetrics, STEP + 5), train_loss=1.5)
    cb.on_step(later)
    cb.flush(wait=True)
    paused = cb.checkpoint_metrics(STEP + 5)
    assert paused["train_loss"] == 1.5
    assert paused["valid_loss"] is None and paused["valid_mean_token_accuracy"] is None
    evaluated = cb.checkpoint_metrics(STEP)  # from its stored row now
    assert evaluated["valid_loss"] == VALUE["val_loss"] and evaluated["train_loss"] == VALUE["train_loss"]
