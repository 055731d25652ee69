"""Who holds a job: the lease helpers of the job state machine (core/jobstates.py).

A worker claims a job atomically (`claim_job`) and renews its lease by heartbeat (`renew_lease`);
a job whose lease expired is taken back by the reaper (`requeue_expired`). These commit
themselves, because other processes must see them at once; `hand_back` leaves the commit to the
worker, which then re-sends the job's message.

`attempts` counts claims since the job was created or last resumed: a crash-requeue keeps it, a
user's resume resets it (a pause is not a failure), and a graceful hand-off (`hand_back`: the
worker shut down) gives its claim back. So `max_attempts` bounds crashes and lost leases only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from core.jobstates import ConcurrentUpdate, add_event, compare_and_set, transition
from core.models import Job, utcnow
from core.status import ACTIVE, CLAIMABLE, TERMINAL, JobStatus


def claim_job(session: Session, job_id: str, worker_id: str, lease_seconds: float) -> Job | None:
    """Atomically take the job for `worker_id` if nobody holds it and it is waiting to run.
    Returns the claimed Job (committed), or None: the message was a replay, the job finished,
    was cancelled/paused, or another worker got it first. Drop the message in that case."""
    now = utcnow()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner.is_(None), Job.status.in_(CLAIMABLE))
        .values(
            lease_owner=worker_id,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            attempts=Job.attempts + 1,
            updated_at=now,
        ),
        execution_options={"synchronize_session": False},
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        return None
    session.commit()
    job = session.get(Job, job_id, populate_existing=True)
    return job


def renew_lease(session: Session, job_id: str, worker_id: str, lease_seconds: float) -> bool:
    """Heartbeat: extend the lease. False when the worker no longer holds the job (the reaper
    re-queued it, or it was released): the worker must stop working on it."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id)
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)),
        execution_options={"synchronize_session": False},
    )
    session.commit()
    return result.rowcount == 1  # type: ignore[attr-defined]


SHUT_DOWN_EVENT = "The worker shut down; the job goes back to the head of the queue"


def hand_back(session: Session, job: Job) -> Job:
    """A worker shutting down gives its held job back: `queued`, lease released, and the claim not
    counted as an attempt (a hand-off is not a failure). The caller commits, then sends the job's
    message to the head of its queue: the job had its turn."""
    transition(session, job, JobStatus.QUEUED, attempts=max(job.attempts - 1, 0))
    if job.status == JobStatus.QUEUED:  # not when it was cancelled meanwhile (the hold just ended)
        add_event(session, job.id, SHUT_DOWN_EVENT)
    return job


def after_lost_attempt(job: Job, max_attempts: int) -> JobStatus:
    """What a job whose attempt died (its worker lost, or a rank of its distributed run) becomes:
    a cancel or pause asked for meanwhile wins, else it is re-queued while it has attempts left
    (it resumes from its last checkpoint), else it fails with `worker_lost`. The reaper and the
    worker that saw a rank die decide by this one rule."""
    if job.status == JobStatus.CANCELLED or job.cancel_requested:
        return JobStatus.CANCELLED
    if job.pause_requested:
        return JobStatus.PAUSED
    if job.attempts < max_attempts:
        return JobStatus.QUEUED
    return JobStatus.FAILED


def requeue_expired(session: Session, max_attempts: int) -> list[tuple[str, str]]:
    """The reaper: every job whose lease expired (its worker died or lost the database) is
    re-queued when it has attempts left, else failed with error code `worker_lost`. A pending
    cancel or pause is honoured instead. Commits; returns [(job_id, queue)] to enqueue again."""
    now = utcnow()
    expired = session.scalars(
        select(Job)
        .where(Job.lease_owner.is_not(None), Job.lease_expires_at < now)
        .order_by(Job.created_at)
        .execution_options(populate_existing=True)
    ).all()
    to_enqueue: list[tuple[str, str]] = []
    for job in expired:
        # guard every change by the lease still being expired: a late heartbeat wins
        still_expired = Job.lease_expires_at < now
        outcome = after_lost_attempt(job, max_attempts)
        if job.status in TERMINAL:  # cancelled while held, its worker gone: only the lease is left
            compare_and_set(session, job, {"lease_owner": None, "lease_expires_at": None}, still_expired)
        elif outcome in (JobStatus.CANCELLED, JobStatus.PAUSED):
            _transition_if_expired(session, job, outcome, still_expired)
        elif outcome == JobStatus.QUEUED:
            if job.status in ACTIVE:
                requeued = _transition_if_expired(session, job, JobStatus.QUEUED, still_expired)
            else:  # claimed while queued, lost before it started: just give the job back
                requeued = compare_and_set(
                    session, job, {"lease_owner": None, "lease_expires_at": None}, still_expired
                )
            if requeued:
                add_event(
                    session,
                    job.id,
                    f"worker lost; re-queued (attempt {job.attempts + 1} of {max_attempts})",
                    level="warn",
                    data={"attempt": job.attempts + 1, "max_attempts": max_attempts},
                )
                to_enqueue.append((job.id, job.queue))
        else:
            _transition_if_expired(
                session,
                job,
                JobStatus.FAILED,
                still_expired,
                error_code="worker_lost",
                error_message=(
                    f"The worker running this job stopped responding (its lease expired) on each of "
                    f"{job.attempts} attempts (max_attempts={max_attempts}), so the job was given up. "
                    "Check the worker's logs (out of memory? killed? machine lost?), then start a new job."
                ),
            )
    session.commit()
    return to_enqueue


def _transition_if_expired(
    session: Session, job: Job, new_status: str, still_expired: ColumnElement[bool], **fields: Any
) -> bool:
    """transition() guarded by the lease still being the expired one we saw; False if it is not."""
    try:
        transition(session, job, new_status, guard=still_expired, **fields)
    except ConcurrentUpdate:
        return False
    return True
