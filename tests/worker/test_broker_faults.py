"""Broker faults and worker hand-offs with real processes: real `fromscratch worker`s on a Redis
server of the test's own (started on a free port, killed by PID, restarted empty: nothing on disk),
the session's PostgreSQL. Short lease (5 s), heartbeat (1 s) and reaper (1 s); tiny jobs.

Every wait polls a real condition (a status, a step, what the queue holds) with a generous
timeout; nothing asserts on timings. The one fixed wait is the outage itself."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from core.broker import TRAIN_TASK, make_celery
from core.broker_queues import queued_job_ids
from core.jobstates import request_cancel
from core.models import Event, Job
from core.settings import Settings
from tests.fixtures.service import (
    ServiceProcess,
    cancel_unfinished_jobs,
    env_from_settings,
    fromscratch_cmd,
    get_job,
    make_job,
    utcnow,
    wait_for_status,
    wait_until,
)
from tests.fixtures.throwaway_redis import ThrowawayRedis
from tests.worker.helpers import assert_clean_series, checkpoint_rows, event_messages, long_run, metric_rows

FAST = dict(lease_seconds=5.0, heartbeat_seconds=1.0, reaper_interval_seconds=1.0)
OUTAGE_SECONDS = 30.0
SHORT = dict(max_steps=40, batch_size=4, checkpoint_every=10, eval_every=20, eval_batches=1, log_every=1)


class Workers:
    """`fromscratch worker` processes on the test's own Redis."""

    def __init__(self, settings: Settings, tmp_path: Path) -> None:
        self.settings, self.tmp_path = settings, tmp_path
        self.procs: list[ServiceProcess] = []

    def start(self) -> ServiceProcess:
        cmd = fromscratch_cmd("worker", "--loglevel", "info")
        log = self.tmp_path / f"worker{len(self.procs) + 1}.log"
        proc = ServiceProcess(cmd=cmd, env=env_from_settings(self.settings), log_path=log).start()
        self.procs.append(proc)
        wait_until(
            lambda: " ready." in proc.output(), timeout=120, message=lambda: f"worker ready\n{self.output()}"
        )
        return proc

    def holding(self, lease_owner: str | None) -> ServiceProcess:
        """The worker whose id (`host:pid:hex`) is `lease_owner`."""
        assert lease_owner is not None
        pid = int(lease_owner.split(":")[-2])
        return next(p for p in self.procs if p.pid == pid)

    def output(self) -> str:
        return "\n".join(p.output() for p in self.procs)

    def full_log(self) -> str:
        return "".join(log.read_text(errors="replace") for p in self.procs for log in p.logs)


@pytest.fixture
def fault_settings(settings: Settings, throwaway_redis: ThrowawayRedis) -> Settings:
    return type(settings)(**{**settings.model_dump(), "broker_url": throwaway_redis.url, **FAST})


@pytest.fixture
def workers(fault_settings: Settings, session_factory: Any, tmp_path: Path) -> Iterator[Workers]:
    cancel_unfinished_jobs(session_factory)  # other tests' leftovers: not for these workers' reapers
    started = utcnow()
    group = Workers(fault_settings, tmp_path)
    yield group
    for proc in group.procs:
        proc.stop()
    cancel_unfinished_jobs(session_factory, since=started)


def queued(settings: Settings) -> list[str]:
    celery = make_celery(settings)
    try:
        return queued_job_ids(celery, TRAIN_TASK, [settings.default_queue])
    finally:
        celery.close()


def running_seq(session_factory: Any, job_id: str) -> list[int]:
    """Event seqs of the job's `running` transitions (one per claim that started training)."""
    with session_factory() as session:
        return list(
            session.scalars(
                select(Event.seq).where(Event.job_id == job_id, Event.message == "Job status: running")
            )
        )


def step_of(session_factory: Any, job_id: str) -> Callable[[], int]:
    return lambda: int(get_job(session_factory, job_id).step or 0)


# ---------------------------------------------------------------------------------------- (a)
def test_redis_killed_during_a_job_and_restarted_empty(
    fault_settings: Settings, session_factory: Any, throwaway_redis: ThrowawayRedis, workers: Workers
) -> None:
    workers.start()
    running = make_job(fault_settings, session_factory, train=long_run(300))
    wait_until(lambda: step_of(session_factory, running)() >= 5, timeout=120, message=workers.output)
    # created just before the kill: its message waits in Redis behind the running job, and dies with it
    waiting = make_job(fault_settings, session_factory, train=SHORT)
    wait_until(lambda: queued(fault_settings) == [waiting], timeout=30, message="the message in the queue")

    throwaway_redis.kill()
    killed_at, step_at_kill = time.monotonic(), step_of(session_factory, running)()
    # training goes on without the broker
    wait_until(
        lambda: step_of(session_factory, running)() > step_at_kill + 5, timeout=60, message=workers.output
    )
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - killed_at)))  # the outage itself
    throwaway_redis.start()  # empty: the waiting job's message is gone

    done = wait_for_status(session_factory, running, "succeeded", diagnostics=workers.output)
    resent = wait_for_status(session_factory, waiting, "succeeded", diagnostics=workers.output)
    assert (done.attempts, resent.attempts) == (1, 1)
    assert_clean_series(metric_rows(session_factory, running), total_steps=300)
    assert_clean_series(metric_rows(session_factory, waiting), total_steps=SHORT["max_steps"])

    log = workers.full_log()
    assert f"job {waiting}: the broker lost its message" in log, workers.output()
    # one line per component per state change, no traceback
    assert log.count("broker unreachable: reaper") == 1, workers.output()
    assert len(re.findall(r"broker reachable again after \d+ s: reaper", log)) == 1, workers.output()
    assert log.count("broker unreachable: worker consumer") <= 1, workers.output()
    assert "Trying again" not in log and "Traceback" not in log, workers.output()


# ---------------------------------------------------------------------------------------- (b)
def test_sigterm_hands_the_job_to_the_waiting_worker_at_the_head_of_the_queue(
    fault_settings: Settings, session_factory: Any, workers: Workers
) -> None:
    # Both long jobs run until cancelled: a job that could finish on its own might end before the
    # SIGTERM on a slow machine (starting the second worker can take a while under load).
    first = workers.start()
    handed = make_job(fault_settings, session_factory, train=long_run(100_000))
    wait_until(lambda: step_of(session_factory, handed)() >= 10, timeout=120, message=workers.output)
    assert workers.holding(get_job(session_factory, handed).lease_owner) is first

    second = workers.start()
    busy = make_job(fault_settings, session_factory, train=long_run(100_000))
    wait_until(lambda: get_job(session_factory, busy).lease_owner, timeout=60, message=workers.output)
    assert workers.holding(get_job(session_factory, busy).lease_owner) is second
    later = [make_job(fault_settings, session_factory, train=SHORT) for _ in range(2)]
    wait_until(lambda: queued(fault_settings) == later, timeout=30, message="the later jobs in the queue")

    assert first.stop(timeout=60) == 0  # SIGTERM: checkpoint, hand the job back, exit
    job = get_job(session_factory, handed)
    assert job.status == "queued" and job.lease_owner is None
    assert job.attempts == 0  # the hand-off gave its claim back: not a failed attempt
    handed_back_at = job.step
    assert checkpoint_rows(session_factory, handed)[-1].step == handed_back_at
    assert queued(fault_settings)[0] == handed  # at the head, before the jobs sent after it
    cancel(session_factory, busy)  # the second worker is free from its next step on
    wait_for_status(session_factory, busy, "cancelled", timeout=60, diagnostics=workers.output)

    # the second worker resumes the handed-back job from its checkpoint and trains on
    wait_until(
        lambda: (
            get_job(session_factory, handed).status == "running"
            and step_of(session_factory, handed)() >= handed_back_at + 10
        ),
        timeout=120,
        message=workers.output,
    )
    assert workers.holding(get_job(session_factory, handed).lease_owner) is second
    cancel(session_factory, handed)
    done = wait_for_status(session_factory, handed, "cancelled", timeout=60, diagnostics=workers.output)
    assert done.attempts == 1
    rows = metric_rows(session_factory, handed)
    assert_clean_series(rows, total_steps=rows[-1].step)  # no step trained twice, none skipped
    assert rows[-1].step >= handed_back_at + 10
    resumed = [m for m in event_messages(session_factory, handed) if m.startswith("Resuming")]
    assert len(resumed) == 1, resumed
    for job_id in later:
        wait_for_status(session_factory, job_id, "succeeded", diagnostics=workers.output)
    # the second worker took the handed-back job before the two sent before the hand-off
    resumed_at = running_seq(session_factory, handed)[-1]
    assert all(resumed_at < running_seq(session_factory, job_id)[0] for job_id in later)


def cancel(session_factory: Any, job_id: str) -> None:
    with session_factory() as session:
        request_cancel(session, session.get(Job, job_id))
        session.commit()


# ---------------------------------------------------------------------------------------- (c)
def test_twelve_jobs_over_two_workers_one_killed(
    fault_settings: Settings, session_factory: Any, workers: Workers
) -> None:
    import signal

    first, second = workers.start(), workers.start()
    train = {**SHORT, "max_steps": 60}
    jobs = [make_job(fault_settings, session_factory, train=train) for _ in range(12)]

    def a_job_mid_way() -> str | None:
        """The lease owner of a job mid-way through training (a checkpoint stored, 20+ steps to go),
        once 3 jobs are done."""
        done = [get_job(session_factory, j) for j in jobs]
        if sum(j.status == "succeeded" for j in done) < 3:
            return None
        mid_way = (j for j in done if j.status == "running" and (j.step or 0) <= 40)
        return next((j.lease_owner for j in mid_way if checkpoint_rows(session_factory, j.id)), None)

    lease_owner = wait_until(a_job_mid_way, timeout=300, interval=0.1, message=workers.output)
    killed = workers.holding(lease_owner)
    killed.kill(signal.SIGKILL)
    survivor = second if killed is first else first
    # the job it held when it died (read after the kill: the one it was training mid-way)
    held = [j for j in jobs if get_job(session_factory, j).lease_owner == lease_owner]
    assert len(held) == 1, "the worker was killed between two jobs"
    victim = held[0]

    for job_id in jobs:
        wait_for_status(session_factory, job_id, "succeeded", timeout=300, diagnostics=workers.output)
    assert survivor.alive
    for job_id in jobs:
        job = get_job(session_factory, job_id)
        assert_clean_series(metric_rows(session_factory, job_id), total_steps=60)  # no step twice
        if job_id == victim:  # trained again from its last checkpoint only
            assert job.attempts == 2 and len(running_seq(session_factory, job_id)) == 2
            resumed = [m for m in event_messages(session_factory, job_id) if m.startswith("Resuming")]
            assert len(resumed) == 1, resumed
        else:  # trained exactly once
            assert job.attempts == 1 and len(running_seq(session_factory, job_id)) == 1, job_id
