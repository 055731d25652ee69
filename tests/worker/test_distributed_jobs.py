"""Service jobs with `devices: 2` on a real CPU worker of two devices (issue 12): the worker
launches two gloo ranks through torchrun's launcher, rank 0's callbacks reach the worker through
the relay (metrics, checkpoints, pause), and the death of a rank ends the attempt: the job goes
back to the queue and resumes from its last checkpoint."""

from __future__ import annotations

import os
import re
import signal

import pytest

from core.jobstates import request_pause, resume
from core.models import Job
from tests.fixtures.processes import spawned_ranks
from tests.fixtures.service import get_job, make_job, send_job, wait_for_status, wait_until
from tests.worker.helpers import assert_clean_series, checkpoint_rows, event_messages, long_run, metric_rows

FAST_LEASE = dict(lease_seconds=5.0, heartbeat_seconds=1.0, reaper_interval_seconds=1.0)
TWO_DEVICES = dict(cpu_worker_devices=2, worker_devices=2)
pytestmark = [
    pytest.mark.service_settings(**FAST_LEASE, **TWO_DEVICES),
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a worker of 2 CPU devices needs 2 cores"),
]


def _wait_for_step(session_factory, job_id: str, step: int, worker) -> Job:  # type: ignore[no-untyped-def]
    return wait_until(
        lambda: (j := get_job(session_factory, job_id)).step >= step and j,
        timeout=180,
        message=lambda: f"step {step} of {job_id}\n{worker.output()}",
    )


def test_a_two_device_job_trains_in_two_processes_and_pauses(
    service_settings, session_factory, worker_proc
) -> None:
    total, batch = 120, 4
    # float32 asked for: dtype auto picks bfloat16 on a CPU with native bf16 that a probe finds faster
    train = long_run(total, devices=2, batch_size=batch, log_every=1, dtype="float32")
    job_id = make_job(service_settings, session_factory, train=train)
    assert get_job(session_factory, job_id).queue == "cpu.2"
    _wait_for_step(session_factory, job_id, 10, worker_proc)
    started = [m for m in event_messages(session_factory, job_id) if m.startswith("Training on ")]
    assert started and started[0].startswith("Training on 2 x cpu in float32: "), started

    with session_factory() as session:  # what the API's /pause does
        request_pause(session, session.get(Job, job_id))
        session.commit()
    paused = wait_for_status(session_factory, job_id, "paused", timeout=60, diagnostics=worker_proc.output)
    assert 10 <= paused.step < total
    assert checkpoint_rows(session_factory, job_id)[-1].step == paused.step
    wait_until(lambda: not spawned_ranks(worker_proc.pid), timeout=30, message="the ranks to exit")

    with session_factory() as session:
        _, needs_enqueue = resume(session, session.get(Job, job_id))
        session.commit()
    assert needs_enqueue
    send_job(service_settings, job_id, "cpu.2")
    done = wait_for_status(session_factory, job_id, "succeeded", timeout=300, diagnostics=worker_proc.output)
    assert done.step == total
    ctx = done.model_config["ctx"]
    assert done.trained_tokens == total * batch * 2 * ctx  # the global batch: batch_size x devices
    assert_clean_series(metric_rows(session_factory, job_id), total_steps=total)
    assert f"Resuming from the checkpoint at step {paused.step}" in event_messages(session_factory, job_id)


def test_a_killed_rank_requeues_the_job_which_resumes_from_its_checkpoint(
    service_settings, session_factory, worker_proc
) -> None:
    total, every = 600, 10  # long enough that the kill lands well before the end
    train = long_run(total, devices=2, checkpoint_every=every, log_every=1)
    job_id = make_job(service_settings, session_factory, train=train)
    wait_until(
        lambda: checkpoint_rows(session_factory, job_id),
        timeout=180,
        message=lambda: f"a checkpoint\n{worker_proc.output()}",
    )
    ranks = spawned_ranks(worker_proc.pid)
    assert len(ranks) == 2, ranks
    os.kill(ranks[-1], signal.SIGKILL)  # one of the two (their ranks are not visible from here)

    done = wait_for_status(session_factory, job_id, "succeeded", timeout=300, diagnostics=worker_proc.output)
    assert worker_proc.alive  # the worker itself lived on and ran the next attempt
    assert done.step == total and done.attempts == 2
    assert_clean_series(metric_rows(session_factory, job_id), total_steps=total, max_gap=every)
    messages = event_messages(session_factory, job_id)
    died = [m for m in messages if re.match(r"The training process [01] of 2 died \(SIGKILL\)", m)]
    assert died and "resumes from its last checkpoint (attempt 2 of 3)" in died[0], messages
    assert any(m.startswith("Resuming from the checkpoint at step ") for m in messages), messages
