"""`max_running_jobs_per_key`: a worker does not start a job whose owner already has that many jobs
held by workers (being validated or trained). Such a job is *deferred*: it is (or becomes)
`queued`, its message is dropped, and it gets one `waiting` event saying why.

How a deferred job is sent again, without anyone polling:
- when a worker lets go of a job (any ending: succeeded, failed, cancelled, paused, re-queued),
  `resend_deferred` re-sends the deferred jobs of the same owner, as many as there are free running
  slots now, to the head of the queue (they had their turn; a deferred job is one whose newest
  event is the `waiting` event);
- as a fallback (a worker killed between the two), the reaper's lost-message pass re-sends a job
  whose message the broker no longer holds once its owner has a free slot (worker/reaper.py).

The check and the claim run in one transaction under the owner's quota lock (core.quotas), so two
workers claiming two jobs of the same owner at once cannot both take the last slot.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.jobstates import ConcurrentUpdate, add_event, transition
from core.models import Event, Job
from core.quotas import held_jobs, lock_owner
from core.status import JobStatus

log = logging.getLogger(__name__)

WAITING = "max_running_jobs_per_key"  # the `waiting_for` of the event that marks a deferred job


def defer_if_owner_busy(session: Session, job_id: str, max_running: int) -> bool:
    """True when the job must wait (the owner's running slots are full): the `waiting` event is
    written (once per wait) and the caller commits and drops the message. False otherwise; then
    the owner's quota lock is held, and the caller claims the job in this same transaction."""
    job = session.get(Job, job_id)
    if job is None or not job.is_unclaimed:
        return False  # not claimable anyway: the claim says so
    lock_owner(session, job.owner_id)
    running = held_jobs(session, job.owner_id)
    if running < max_running:
        return False
    session.refresh(job)  # as of now, under the lock
    if job.status == JobStatus.VALIDATING_FILES:  # not being validated: waiting, like any queued job
        try:
            transition(session, job, JobStatus.QUEUED)
        except ConcurrentUpdate:  # cancelled, paused or claimed meanwhile: not ours to start now
            return True
    if not _is_deferred(session, job_id):
        add_event(
            session,
            job_id,
            f"Waiting to start: this key already has {running} jobs running, the most "
            f"max_running_jobs_per_key={max_running} allows. The job starts when one of them ends.",
            data={"waiting_for": WAITING, "running": running, "max_running_jobs_per_key": max_running},
        )
    log.info("job %s deferred: its owner has %d of %d jobs running", job_id, running, max_running)
    return True


def _is_deferred(session: Session, job_id: str) -> bool:
    """The job's newest event is its `waiting` event (nothing has happened to it since)."""
    data: dict[str, Any] | None = session.scalar(
        select(Event.data).where(Event.job_id == job_id).order_by(Event.seq.desc()).limit(1)
    )
    return data is not None and data.get("waiting_for") == WAITING


def deferred_to_resend(
    session_factory: sessionmaker[Session], job_id: str, max_running: int
) -> list[tuple[str, str]]:
    """[(job id, queue)] of the deferred jobs of `job_id`'s owner that may start now, oldest
    first, at most as many as the owner has free running slots."""
    with session_factory() as session:
        owner_id = session.scalar(select(Job.owner_id).where(Job.id == job_id))
        if owner_id is None:
            return []
        free = max_running - held_jobs(session, owner_id)
        if free <= 0:
            return []
        waiting = session.execute(
            select(Job.id, Job.queue)
            .where(Job.owner_id == owner_id, Job.unclaimed())
            .order_by(Job.created_at, Job.id)
        ).all()
        return [(w.id, w.queue) for w in waiting if _is_deferred(session, w.id)][:free]


def resend_deferred(session_factory: sessionmaker[Session], job_id: str, max_running: int) -> list[str]:
    """After this worker let go of `job_id`: send the messages of the owner's deferred jobs that
    may start now (see the module docstring). Never raises: the reaper is the fallback."""
    try:
        to_send = deferred_to_resend(session_factory, job_id, max_running)
        if not to_send:
            return []
        from worker.celery_app import enqueue_job

        # newest first: the last message moved to the head is taken first, so the oldest goes first
        for waiting_id, queue in reversed(to_send):
            log.info("job %s: a running slot of its owner is free; sending it again", waiting_id)
            enqueue_job(waiting_id, queue, front=True)
    except Exception:  # the reaper's lost-message pass re-sends what we could not
        log.warning("could not re-send the deferred jobs after %s; the reaper will", job_id, exc_info=True)
        return []
    return [waiting_id for waiting_id, _ in to_send]
