"""A free worker starts the fairest waiting job (worker/fair_pick.py): the ranking on database rows,
and a real worker that gives another key's job its turn before the first key's queued backlog."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.jobstates import request_cancel
from core.models import File, Job, utcnow
from core.settings import Settings
from tests.fixtures.service import ServiceProcess, get_job, make_job, wait_for_status, wait_until
from tests.worker.helpers import SMALL_RUN, long_run
from worker.fair_pick import fairest_waiting

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Rows:
    """Jobs on a queue of this test's own (the test database holds other tests' jobs)."""

    def __init__(self, session_factory: Any) -> None:
        self.session_factory = session_factory
        self.queue = "t-" + secrets.token_hex(4)
        with session_factory() as s:
            f = File(
                owner_id="x", filename="f.txt", purpose="fine-tune", bytes=1, sha256="0" * 64, format="text"
            )
            s.add(f)
            s.commit()
            self.file_id = f.id

    def owner(self) -> str:
        return "owner-" + secrets.token_hex(6)

    def job(
        self, owner: str, minute: int, *, status: str = "queued", held: bool = False, **extra: Any
    ) -> str:
        with self.session_factory() as s:
            job = Job(
                owner_id=owner,
                model="llama-tiny",
                training_file=self.file_id,
                status=status,
                seed=1,
                queue=self.queue,
                created_at=T0 + timedelta(minutes=minute),
                lease_owner="w:1:x" if held else None,
                **extra,
            )
            s.add(job)
            s.commit()
            return job.id

    def ranked(self, max_running: int = 4) -> list[str]:
        with self.session_factory() as s:
            return fairest_waiting(s, self.queue, max_running)


def test_the_owner_with_fewer_jobs_running_goes_first(session_factory: Any) -> None:
    rows = Rows(session_factory)
    busy, idle = rows.owner(), rows.owner()
    rows.job(busy, 0, status="running", held=True)
    busy_waiting = rows.job(busy, 1)
    idle_waiting = rows.job(idle, 2)  # newer, but its owner runs nothing
    assert rows.ranked() == [idle_waiting, busy_waiting]


def test_between_equally_busy_owners_the_one_served_least_recently_goes_first(session_factory: Any) -> None:
    rows = Rows(session_factory)
    recent, earlier, never = rows.owner(), rows.owner(), rows.owner()
    rows.job(recent, 0, status="succeeded", started_at=T0 + timedelta(hours=2))
    rows.job(earlier, 0, status="succeeded", started_at=T0 + timedelta(hours=1))
    recent_a, recent_b = rows.job(recent, 1), rows.job(recent, 2)
    earlier_a = rows.job(earlier, 3)
    never_a = rows.job(never, 4)
    # never served, then served an hour before the other; one owner's own jobs oldest first
    assert rows.ranked() == [never_a, earlier_a, recent_a, recent_b]


def test_only_claimable_jobs_of_owners_with_a_free_slot_are_ranked(session_factory: Any) -> None:
    rows = Rows(session_factory)
    full, free = rows.owner(), rows.owner()
    rows.job(full, 0, status="running", held=True)
    rows.job(full, 0, status="validating_files", held=True)
    rows.job(full, 1)  # its owner's two slots are in use
    rows.job(free, 2, status="paused")
    rows.job(free, 3, status="cancelled")
    rows.job(free, 4, held=True)  # claimed a moment ago
    waiting = rows.job(free, 5)
    assert rows.ranked(max_running=2) == [waiting]
    assert Rows(session_factory).ranked() == []  # another queue's jobs are not its


# The reapers stay out of the way (hourly): this is about the worker's own choice and re-send.
@pytest.mark.service_settings(reaper_interval_seconds=3600.0)
def test_another_keys_job_starts_before_a_backlog_queued_earlier(
    service_settings: Settings, session_factory: Any, worker_proc: ServiceProcess, tmp_path: Path
) -> None:
    first_key, second_key = "owner-a-" + secrets.token_hex(4), "owner-b-" + secrets.token_hex(4)
    running = make_job(service_settings, session_factory, owner_id=first_key, train=long_run(400))
    wait_until(
        lambda: get_job(session_factory, running).step >= 1,
        timeout=120,
        message=lambda: f"the first job to train\n{worker_proc.output()}",
    )
    backlog = [
        make_job(service_settings, session_factory, owner_id=first_key, train=SMALL_RUN) for _ in range(2)
    ]
    other = make_job(service_settings, session_factory, owner_id=second_key, train=SMALL_RUN)
    with session_factory() as s:
        request_cancel(s, s.get(Job, running))
        s.commit()
    wait_for_status(session_factory, running, "cancelled", diagnostics=worker_proc.output)

    done = {
        job: wait_for_status(session_factory, job, "succeeded", diagnostics=worker_proc.output)
        for job in [other, *backlog]
    }
    starts = sorted(done, key=lambda job: done[job].started_at or utcnow())
    # the second key's job first, then the backlog in its order; each ran once
    assert starts == [other, *backlog], worker_proc.output()
    assert all(job.attempts == 1 for job in done.values())
    assert f"starting {other} instead" in worker_proc.output()
