"""Which waiting job a free worker starts: the fairest one on the message's queue, not simply the
job the message names.

Messages reach a queue in the order jobs were sent, so one key that queued thirty jobs would keep
every other key's job waiting behind all thirty. Instead, the worker that takes a message ranks the
jobs waiting on that queue (claimable, held by nobody, their owner under `max_running_jobs_per_key`):
1. the owner with the fewest jobs held by workers now,
2. then the owner served least recently: whose newest job started earliest, or never,
3. then the oldest job.
With one worker, two keys' jobs take turns; with several, a key's share of the workers evens out.

Every waiting job keeps a message of its own (the reaper's lost-message pass relies on that): when
the worker starts another job than the message names, it sends the named job's message back to
the head of the queue (worker/lease.py), where the next free worker takes it and ranks again.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.models import Job
from core.quotas import held_jobs_by_owner

NEVER = datetime.min.replace(tzinfo=UTC)  # the last start of an owner never served: before any


def fairest_waiting(session: Session, queue: str, max_running: int) -> list[str]:
    """Ids of the jobs waiting on `queue` whose owner may start one now, fairest first."""
    waiting = session.execute(
        select(Job.id, Job.owner_id)
        .where(Job.queue == queue, Job.unclaimed())
        .order_by(Job.created_at, Job.id)
    ).all()
    owners = {row.owner_id for row in waiting}
    if not owners:
        return []
    held = held_jobs_by_owner(session, owners)
    last_start: dict[str, datetime | None] = dict(
        session.execute(
            select(Job.owner_id, func.max(Job.started_at))
            .where(Job.owner_id.in_(owners))
            .group_by(Job.owner_id)
        ).all()
    )

    def rank(position: int) -> tuple[int, datetime, int]:
        owner = waiting[position].owner_id
        return (held.get(owner, 0), last_start.get(owner) or NEVER, position)

    eligible = [i for i, row in enumerate(waiting) if held.get(row.owner_id, 0) < max_running]
    return [waiting[i].id for i in sorted(eligible, key=rank)]
