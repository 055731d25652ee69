"""Why a waiting job waits: a job's `waiting_for` (our extension), read when the job is served.

A job waiting to be claimed (`queued`/`validating_files`, no worker holding it) either waits its
turn behind other jobs (no reason given: it starts when a worker of its queue is free), or cannot
start until something changes, which the job then says:
- no live worker consumes its queue (a `device: cuda` job on a service whose GPU nodes are down or
  scaled to zero; a queue no worker was started for): it would otherwise wait silently for ever;
- its key already holds `max_running_jobs_per_key` jobs (worker/running_quota.py defers it).
Liveness is what GET /v1/workers shows: a worker row refreshed within `lease_seconds`."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Job, Worker
from core.quotas import held_jobs_by_owner
from core.settings import Settings


def live_queues(session: Session, settings: Settings) -> set[str]:
    """The queues consumed by a worker seen within `lease_seconds`."""
    rows = session.scalars(select(Worker.queues).where(Worker.alive(settings.lease_seconds)))
    return {queue for queues in rows for queue in queues}


def waiting_reasons(session: Session, jobs: Iterable[Job], settings: Settings) -> dict[str, str]:
    """job id -> why it cannot start now, for the waiting jobs among `jobs` that cannot."""
    waiting = [job for job in jobs if job.is_unclaimed]
    if not waiting:
        return {}
    live = live_queues(session, settings)
    held = held_jobs_by_owner(session, {job.owner_id for job in waiting})
    reasons = {}
    for job in waiting:
        if job.queue not in live:
            reasons[job.id] = (
                f"no live worker consumes queue '{job.queue}' (GET /v1/workers): the job starts when one does"
            )
        elif held.get(job.owner_id, 0) >= settings.max_running_jobs_per_key:
            reasons[job.id] = (
                f"this key's {held[job.owner_id]} running jobs are its max_running_jobs_per_key "
                f"({settings.max_running_jobs_per_key}): the job starts when one of them ends"
            )
    return reasons


def waiting_for(session: Session, job: Job, settings: Settings) -> str | None:
    return waiting_reasons(session, [job], settings).get(job.id)
