"""ServiceCallbacks against a real database (PostgreSQL and the embedded SQLite): a metrics flush
reads the job's cancel/pause requests in its own UPDATE, so should_stop() sees them without a query
of its own (one round trip per flush interval, not one more per stop check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from core.blobstore import blobstore_from_settings
from core.job_leases import claim_job
from core.jobstates import request_cancel, request_pause
from core.models import Event, Job
from core.settings import Settings
from tests.fixtures.service import make_job
from trainer.config.metrics import StepMetrics
from worker.callbacks import ServiceCallbacks

WORKER = "host:1:callbacks-test"


@pytest.fixture(params=["postgres", "sqlite"])
def db(request: pytest.FixtureRequest) -> tuple[Settings, sessionmaker[Session]]:
    if request.param == "postgres":
        return request.getfixturevalue("settings"), request.getfixturevalue("session_factory")
    return request.getfixturevalue("sqlite_settings"), request.getfixturevalue("sqlite_session_factory")


def claimed_job(settings: Settings, session_factory: sessionmaker[Session]) -> str:
    job_id = make_job(settings, session_factory, enqueue=False, status="queued")
    with session_factory() as session:
        assert claim_job(session, job_id, WORKER, lease_seconds=600) is not None
    return job_id


def service_callbacks(
    settings: Settings, session_factory: sessionmaker[Session], job_id: str, tmp_path: Path, **overrides: Any
) -> ServiceCallbacks:
    """The worker's callbacks for a claimed job: every step flushes unless `overrides` say otherwise."""
    options: dict[str, Any] = {"job_id": job_id, "worker_id": WORKER, "scratch": tmp_path}
    options |= {"checkpoint_model_id": lambda s: f"ckpt-{s}", "keep_checkpoints": None}
    options |= {"flush_seconds": 0.0, "db_retry_seconds": 5.0, **overrides}
    return ServiceCallbacks(session_factory, blobstore_from_settings(settings, session_factory), **options)


def step(cb: ServiceCallbacks, n: int) -> None:
    cb.on_step(
        StepMetrics(step=n, train_loss=2.0, lr=1e-3, grad_norm=1.0, tokens_per_s=1000.0, tokens_seen=n * 64)
    )


@pytest.mark.parametrize(
    ("ask", "answer"), [(request_cancel, "stop"), (request_pause, "pause")], ids=["cancel", "pause"]
)
def test_a_flush_is_also_the_stop_check(
    db: tuple[Settings, sessionmaker[Session]], tmp_path: Path, ask: Any, answer: str
) -> None:
    settings, session_factory = db
    job_id = claimed_job(settings, session_factory)
    # every step flushes, and no separate read would come in this test's lifetime
    cb = service_callbacks(settings, session_factory, job_id, tmp_path, stop_check_seconds=1e9)
    step(cb, 1)
    assert cb.should_stop() is None

    with session_factory() as session:
        ask(session, session.get(Job, job_id))
        session.commit()
    step(cb, 2)  # the flush writes step 2 and reads the request back

    statements: list[str] = []
    engine = session_factory.kw["bind"]
    listener = lambda *args: statements.append(args[2])  # noqa: E731  # (conn, cursor, statement, ...)
    event.listen(engine, "before_cursor_execute", listener)
    try:
        assert cb.should_stop() == answer
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert statements == []  # decided from what the flush read
    with session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.step == 2  # and the flush did write


def test_a_decision_is_an_event_at_once(db: tuple[Settings, sessionmaker[Session]], tmp_path: Path) -> None:
    """A note (compile auto's decision) is written when made, not with the flush after the steps it
    precedes: a compile the next step runs takes long, and the job page says why it waits."""
    settings, session_factory = db
    job_id = claimed_job(settings, session_factory)
    # steps alone never flush in this test's lifetime
    cb = service_callbacks(
        settings, session_factory, job_id, tmp_path, flush_seconds=1e9, stop_check_seconds=1e9
    )
    step(cb, 1)
    cb.on_note("torch.compile on at step 1: compiling the blocks")
    with session_factory() as session:
        messages = session.scalars(select(Event.message).where(Event.job_id == job_id)).all()
        job = session.get(Job, job_id)
    assert "torch.compile on at step 1: compiling the blocks" in messages
    assert job is not None and job.step == 1  # the steps before it go with it


def test_the_checkpoint_event_says_what_was_written_and_stored() -> None:
    from trainer.run.checkpoint_writer import CheckpointTimes
    from worker.checkpoint_uploads import checkpoint_costs_event

    only_best = CheckpointTimes(count=10, write=1.2, bytes=4_000, weights_only=10)
    message, data = checkpoint_costs_event(only_best, uploads=0, upload_seconds=0.0)
    assert message.startswith(
        "Checkpoints in the background: 10 written (0 step checkpoints, 10 best-model snapshots (best/)) "
        "in 1.2 s; none uploaded (the model is stored at the end)"
    )
    assert (data["step_checkpoints"], data["best_snapshots"], data["uploads"]) == (0, 10, 0)
    both = CheckpointTimes(count=5, write=0.5, weights_only=2)
    message, data = checkpoint_costs_event(both, uploads=4, upload_seconds=2.25)
    assert (
        "5 written (3 step checkpoints, 2 best-model snapshots (best/)) in 0.5 s; 4 uploaded in 2.2 s"
        in message
    )
    # a pause's checkpoint, written as training ended, is uploaded with the rest: said apart
    paused = CheckpointTimes(count=3, write=0.5, at_end=1)
    message, data = checkpoint_costs_event(paused, uploads=4, upload_seconds=1.0)
    assert (
        "3 written (3 step checkpoints, 0 best-model snapshots (best/)) in 0.5 s, and 1 step checkpoint as "
        "training ended; 4 uploaded in 1.0 s"
        in message
        and data["at_end"] == 1
    )
