"""Per-key quotas on the worker side: `max_running_jobs_per_key` (a job waits `queued` while its
owner's slots are full and starts when one frees, with no polling), checkpoint pruning under
`max_stored_bytes_per_key` (the job goes on inside the quota, with one warning), and
`max_checkpoints_per_job`."""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from core.blobstore import blobstore_from_settings
from core.models import Blob, Checkpoint, Event, File, Job, utcnow
from core.settings import Settings
from tests.fixtures.service import (
    ServiceProcess,
    get_job,
    make_job,
    wait_for_status,
    wait_until,
)
from tests.worker.helpers import SMALL_RUN, checkpoint_rows, event_messages, long_run
from worker.checkpoint_store import store_checkpoint

FAST_LEASE = dict(lease_seconds=5.0, heartbeat_seconds=1.0, reaper_interval_seconds=1.0)
WAITING = "Waiting to start"
RESENT = "a running slot of its owner is free; sending it again"


def new_owner() -> str:
    return f"owner-{secrets.token_hex(6)}"


def warnings_of(session_factory: Any, job_id: str) -> list[Event]:
    with session_factory() as s:
        rows = s.scalars(select(Event).where(Event.job_id == job_id, Event.level == "warn")).all()
        s.expunge_all()
        return list(rows)


# ------------------------------------------------------------------------------- running jobs
# The reapers stay out of the way (hourly): on its 1 s interval a worker's reaper thread could find
# the deferred job's message missing and re-send it just before the worker that ended the first job
# did (CI saw it), and this test is about the worker's own re-send.
@pytest.mark.service_settings(max_running_jobs_per_key=1, **{**FAST_LEASE, "reaper_interval_seconds": 3600.0})
def test_a_job_over_the_running_quota_waits_queued_then_starts(
    service_settings: Settings, session_factory: Any, worker_proc: ServiceProcess, tmp_path: Path
) -> None:
    second = ServiceProcess(worker_proc.cmd, worker_proc.env, tmp_path / "worker2.log").start()
    try:

        def logs() -> str:
            return worker_proc.output() + second.output()

        owner = new_owner()
        first = make_job(service_settings, session_factory, owner_id=owner, train=long_run(400))
        wait_until(
            lambda: get_job(session_factory, first).step >= 1,
            timeout=120,
            message=lambda: f"the first job to train\n{logs()}",
        )
        # both workers are up (the idle one will get the next message); their whole logs: earlier
        # tests' leftover messages, dropped at start, can push the ready line out of a tail
        wait_until(
            lambda: " ready" in worker_proc.output(tail=1 << 30) and " ready" in second.output(tail=1 << 30),
            timeout=120,
            message=lambda: f"both workers to be ready\n{logs()}",
        )

        waiting = make_job(service_settings, session_factory, owner_id=owner, train=SMALL_RUN)
        wait_until(
            lambda: any(WAITING in m for m in event_messages(session_factory, waiting)),
            timeout=60,
            message=lambda: f"the second job to be deferred\n{logs()}",
        )
        job = get_job(session_factory, waiting)
        assert job.status == "queued" and job.lease_owner is None and job.attempts == 0
        message = next(m for m in event_messages(session_factory, waiting) if WAITING in m)
        assert "max_running_jobs_per_key=1" in message, message

        done_first = wait_for_status(session_factory, first, "succeeded", diagnostics=logs)
        done = wait_for_status(session_factory, waiting, "succeeded", diagnostics=logs)
        assert done.started_at is not None and done_first.finished_at is not None
        assert done.started_at >= done_first.finished_at  # never two running at once
        assert done.attempts == 1  # a deferral is not an attempt
        assert RESENT in logs(), logs()  # sent again by the worker that ended the first job
        messages = event_messages(session_factory, waiting)
        assert len([m for m in messages if WAITING in m]) == 1, messages
    finally:
        second.stop()


# ------------------------------------------------------------------------------- stored bytes
def _held_job(settings: Settings, session_factory: Any, owner: str, worker_id: str) -> str:
    store = blobstore_from_settings(settings, session_factory)
    with session_factory() as s:
        blob = store.put([b"x" * 100], s)
        f = File(
            owner_id=owner,
            filename="f.txt",
            purpose="fine-tune",
            bytes=100,
            sha256=blob.sha256,
            format="text",
            blob_id=blob.id,
        )
        s.add(f)
        s.flush()
        job = Job(
            owner_id=owner,
            model="llama-tiny",
            training_file=f.id,
            status="running",
            seed=1,
            lease_owner=worker_id,
            lease_expires_at=utcnow() + timedelta(hours=1),
        )
        s.add(job)
        s.commit()
        return job.id


def test_checkpoints_are_pruned_to_stay_inside_the_storage_quota(
    settings: Settings, session_factory: Any, tmp_path: Path
) -> None:
    owner, worker_id = new_owner(), "w-quota"
    job_id = _held_job(settings, session_factory, owner, worker_id)
    store = blobstore_from_settings(settings, session_factory)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(secrets.token_bytes(4000))  # a 10 240-byte tar (one record)
    quota = 100 + 25_000  # the file and two checkpoints fit, three do not

    def store_step(step: int, is_final: bool = False, limit: int = quota) -> None:
        store_checkpoint(
            session_factory,
            store,
            job_id=job_id,
            worker_id=worker_id,
            step=step,
            folder=folder,
            model_id=f"m-{job_id}:ckpt-step-{step}",
            metrics={"step": step},
            is_final=is_final,
            keep=10,
            max_stored_bytes=limit,
        )

    def steps() -> list[int]:
        return [c.step for c in checkpoint_rows(session_factory, job_id)]

    store_step(10)
    store_step(20)
    assert steps() == [10, 20] and warnings_of(session_factory, job_id) == []
    dropped_blob = checkpoint_rows(session_factory, job_id)[0].blob_id
    store_step(30)  # over: the oldest goes
    assert steps() == [20, 30]
    with session_factory() as s:
        assert s.get(Blob, dropped_blob) is None  # its bytes are freed too
    store_step(40)
    assert steps() == [30, 40]
    # a quota below one checkpoint: everything but the newest goes, and the job is not failed
    store_step(50, limit=5_000)
    assert steps() == [50]
    store_step(60, is_final=True, limit=5_000)
    assert steps() == [60] and checkpoint_rows(session_factory, job_id)[0].is_final
    warned = warnings_of(session_factory, job_id)
    assert len(warned) == 1, [w.message for w in warned]  # one warning per job, not one per prune
    assert "max_stored_bytes_per_key" in warned[0].message and warned[0].data is not None
    assert warned[0].data["quota"] == "max_stored_bytes_per_key"
    assert get_job(session_factory, job_id).status == "running"


@pytest.mark.service_settings(max_stored_bytes_per_key=300_000, **FAST_LEASE)
def test_a_job_over_the_storage_quota_still_succeeds(
    service_settings: Settings, session_factory: Any, worker_proc: ServiceProcess
) -> None:
    job_id = make_job(service_settings, session_factory, owner_id=new_owner(), train=SMALL_RUN)
    wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    ckpts = checkpoint_rows(session_factory, job_id)
    assert [(c.step, c.is_final) for c in ckpts] == [(50, True)]  # each checkpoint is over 300 kB
    warned = warnings_of(session_factory, job_id)
    assert all("max_stored_bytes_per_key" in w.message for w in warned), [w.message for w in warned]
    # one warning for the pruned checkpoints (not one per prune), one per export format not stored
    pruned = [w for w in warned if "export" not in (w.data or {})]
    assert len(pruned) == 1, [w.message for w in warned]
    skipped = sorted((w.data or {})["export"] for w in warned if "export" in (w.data or {}))
    assert skipped == ["gguf", "hf"]  # the default export_formats, each too big for what is left


@pytest.mark.service_settings(max_checkpoints_per_job=2, **FAST_LEASE)
def test_max_checkpoints_per_job_caps_keep_checkpoints(
    service_settings: Settings, session_factory: Any, worker_proc: ServiceProcess
) -> None:
    job_id = make_job(service_settings, session_factory, owner_id=new_owner(), train=SMALL_RUN)
    wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    # keep_checkpoints=3 asked, 2 allowed: the two newest step checkpoints + the final one
    assert [c.step for c in checkpoint_rows(session_factory, job_id)] == [30, 40, 50]
    with session_factory() as s:
        assert (
            s.scalar(select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step == 20)) is None
        )
