"""Cancel, pause/resume, SIGTERM and SIGKILL of a real worker process in the middle of a run.

The processes get a short lease (5 s, heartbeat 1 s) and a 1 s reaper so a killed worker's job
comes back quickly; every wait has a generous timeout and nothing asserts on timings."""

from __future__ import annotations

import re
import signal

import pytest

from core.job_leases import SHUT_DOWN_EVENT
from core.jobstates import request_cancel, request_pause, resume
from core.models import Job
from tests.fixtures.service import (
    ServiceProcess,
    env_from_settings,
    fromscratch_cmd,
    get_job,
    make_job,
    send_job,
    wait_for_status,
    wait_until,
)
from tests.worker.helpers import assert_clean_series, checkpoint_rows, event_messages, long_run, metric_rows

FAST_LEASE = dict(lease_seconds=5.0, heartbeat_seconds=1.0, reaper_interval_seconds=1.0)
pytestmark = pytest.mark.service_settings(**FAST_LEASE)


def _request(session_factory, job_id: str, action) -> None:  # type: ignore[no-untyped-def]
    """What the API's /cancel and /pause routes do."""
    with session_factory() as session:
        job = session.get(Job, job_id)
        action(session, job)
        session.commit()


def _wait_for_step(session_factory, job_id: str, step: int, worker) -> None:  # type: ignore[no-untyped-def]
    wait_until(
        lambda: get_job(session_factory, job_id).step >= step,
        timeout=120,
        message=lambda: f"step {step} of {job_id}\n{worker.output()}",
    )


def test_cancel_mid_run(service_settings, session_factory, worker_proc) -> None:
    job_id = make_job(service_settings, session_factory, train=long_run(100_000))
    _wait_for_step(session_factory, job_id, 10, worker_proc)
    _request(session_factory, job_id, request_cancel)
    assert get_job(session_factory, job_id).status == "cancelled"  # at once; the worker stops next
    job = wait_until(
        lambda: (j := get_job(session_factory, job_id)).lease_owner is None and j,
        timeout=30,
        message=lambda: f"the worker to let go of {job_id}\n{worker_proc.output()}",
    )
    assert job.status == "cancelled" and job.fine_tuned_model is None
    assert job.step < 100_000
    # the worker is free for the next job
    nxt = make_job(service_settings, session_factory, train=long_run(30))
    wait_for_status(session_factory, nxt, "succeeded", diagnostics=worker_proc.output)


def test_pause_then_resume_continues_from_the_same_step(
    service_settings, session_factory, worker_proc
) -> None:
    total = 250
    job_id = make_job(service_settings, session_factory, train=long_run(total))
    _wait_for_step(session_factory, job_id, 15, worker_proc)
    _request(session_factory, job_id, request_pause)
    paused = wait_for_status(session_factory, job_id, "paused", timeout=30, diagnostics=worker_proc.output)
    assert paused.lease_owner is None and not paused.pause_requested
    assert 15 <= paused.step < total
    ckpt_steps = [c.step for c in checkpoint_rows(session_factory, job_id)]
    assert ckpt_steps[-1] == paused.step, (ckpt_steps, paused.step)  # a checkpoint of the paused step
    assert max(m.step for m in metric_rows(session_factory, job_id)) == paused.step

    with session_factory() as session:
        job, needs_enqueue = resume(session, session.get(Job, job_id))
        session.commit()
    assert needs_enqueue
    send_job(service_settings, job_id)
    done = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    assert done.step == total
    assert_clean_series(metric_rows(session_factory, job_id), total_steps=total)  # no duplicate steps
    assert f"Resuming from the checkpoint at step {paused.step}" in event_messages(session_factory, job_id)


def test_sigkill_mid_run_resumes_from_last_checkpoint(service_settings, session_factory, worker_proc) -> None:
    total, every = 250, 10
    job_id = make_job(service_settings, session_factory, train=long_run(total, checkpoint_every=every))
    wait_until(
        lambda: any(c.step >= 2 * every for c in checkpoint_rows(session_factory, job_id)),
        timeout=120,
        message=lambda: f"a checkpoint at step >= {2 * every}\n{worker_proc.output()}",
    )
    worker_proc.kill(signal.SIGKILL)
    killed = get_job(session_factory, job_id)
    assert killed.status == "running" and killed.lease_owner is not None and killed.step < total
    last_ckpt = max(c.step for c in checkpoint_rows(session_factory, job_id))

    worker_proc.restart()  # another worker: its reaper re-queues the job once the lease expires
    done = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    assert done.attempts == 2
    assert_clean_series(metric_rows(session_factory, job_id), total_steps=total, max_gap=every)
    messages = event_messages(session_factory, job_id)
    assert any(m.startswith("worker lost; re-queued") for m in messages), messages
    # The suffix appears when the killed worker had logged steps past that checkpoint (timing-dependent).
    resumed = re.compile(
        rf"Resuming from the checkpoint at step {last_ckpt}"
        r"( \(\d+ metric rows after it will be logged again\))?"
    )
    assert any(resumed.fullmatch(m) for m in messages), messages


@pytest.mark.service_settings(max_attempts=1, **FAST_LEASE)
def test_lost_worker_after_max_attempts_fails_the_job(service_settings, session_factory, worker_proc) -> None:
    job_id = make_job(service_settings, session_factory, train=long_run(100_000))
    _wait_for_step(session_factory, job_id, 5, worker_proc)
    worker_proc.kill(signal.SIGKILL)
    worker_proc.restart()
    job = wait_for_status(session_factory, job_id, "failed", timeout=120, diagnostics=worker_proc.output)
    assert job.error_code == "worker_lost"
    assert "max_attempts=1" in job.error_message
    assert job.lease_owner is None


def test_sigterm_checkpoints_and_requeues_the_running_job(
    service_settings, session_factory, worker_proc
) -> None:
    total = 250
    job_id = make_job(service_settings, session_factory, train=long_run(total))
    _wait_for_step(session_factory, job_id, 15, worker_proc)
    assert worker_proc.stop(timeout=60) == 0  # warm shutdown does not wait for the whole run
    job = get_job(session_factory, job_id)
    assert job.status == "queued" and job.lease_owner is None
    assert checkpoint_rows(session_factory, job_id)[-1].step == job.step
    # handed back once: the message sent back is not taken again by the worker shutting down
    assert event_messages(session_factory, job_id).count(SHUT_DOWN_EVENT) == 1, worker_proc.output()

    worker_proc.start()
    done = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    assert done.step == total
    assert_clean_series(metric_rows(session_factory, job_id), total_steps=total)


def test_a_worker_shutting_down_does_not_take_back_the_job_it_handed_back(
    sqlite_settings, sqlite_session_factory, tmp_path
) -> None:
    """`fromscratch serve`'s broker (kombu's SQL transport) gives a worker in its warm shutdown the
    message it has just sent back: the worker claimed the job again only to hand it back again."""
    env = env_from_settings(sqlite_settings)
    cmd = fromscratch_cmd("worker", "--queues", sqlite_settings.worker_queues, "--loglevel", "info")
    worker = ServiceProcess(cmd=cmd, env=env, log_path=tmp_path / "worker.log").start()
    try:
        job_id = make_job(sqlite_settings, sqlite_session_factory, train=long_run(100_000, compile=False))
        _wait_for_step(sqlite_session_factory, job_id, 5, worker)
        assert worker.stop(timeout=60) == 0
    finally:
        worker.stop()
    job = get_job(sqlite_session_factory, job_id)
    assert job.status == "queued" and job.lease_owner is None
    assert event_messages(sqlite_session_factory, job_id).count(SHUT_DOWN_EVENT) == 1, worker.output()
