"""Writing a job the API admitted (api.job_admission), and sending it to the broker after the commit.

`Idempotency-Key`: a retried create with the same key (per owner) gets the job the first request
created (`earlier_job`); a concurrent duplicate loses on the unique constraint (owner_id,
idempotency_key) and gets the winner's job (`insert_job`). The job keeps a fingerprint of the body
that created it (`request_hash`): the same key with a different body is a 400
`idempotency_key_reused`, not the first job.

Quota: the count of the owner's active jobs and the insert happen under the owner's quota lock
(api.quotas), so concurrent creates cannot overshoot `max_active_jobs_per_key`.

`enqueue` sends the job id (core.broker.enqueue_job) only after the commit, so a worker never sees a
job that is not committed; when the broker refuses, the change is undone (`undo_create`,
`undo_resume`) and the request fails with 503.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import Request
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.errors import APIError
from api.quotas import check_active_jobs
from core import jobstates
from core.models import Event, Job
from core.quotas import lock_owner
from core.status import JobStatus

log = logging.getLogger("fromscratch.api")


def earlier_job(session: Session, owner_id: str, idempotency_key: str | None, fingerprint: str) -> Job | None:
    """The job an earlier request with this Idempotency-Key created, if this request is the same
    one again (None without a key or an earlier job); a different body under the same key is a 400
    (it is not a retry)."""
    if not idempotency_key:
        return None
    job = session.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == idempotency_key))
    if job is not None and job.request_hash is not None and job.request_hash != fingerprint:
        raise APIError(
            400,
            f"This Idempotency-Key was already used with other parameters (for job {job.id}); "
            "send a new key with a new request.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return job


def insert_job(
    session: Session, job: Job, idempotency_key: str | None, fingerprint: str, max_active_jobs: int
) -> tuple[Job, bool]:
    """Commit `job` with its lifecycle events: (job, True); or (the earlier job, False) when a
    request with the same Idempotency-Key got there first. 429 when the quota refuses."""
    owner_id = job.owner_id
    # The owner's quota lock, held until the commit below: the count and the insert are one step.
    lock_owner(session, owner_id)
    if (twin := earlier_job(session, owner_id, idempotency_key, fingerprint)) is not None:
        return twin, False  # a concurrent twin committed while we waited for the lock
    check_active_jobs(session, owner_id, max_active_jobs)
    job.idempotency_key = idempotency_key or None
    job.request_hash = fingerprint
    session.add(job)
    try:
        session.flush()  # the job's id, for its events
        jobstates.add_event(
            session,
            job.id,
            f"Created fine-tuning job: {job.id}",
            data={"status": job.status, "model": job.model},
        )
        session.commit()
    except IntegrityError:  # a concurrent request with the same Idempotency-Key won
        session.rollback()
        winner = earlier_job(session, owner_id, idempotency_key, fingerprint)
        if winner is None:
            raise
        return winner, False
    return job, True


def enqueue(request: Request, session: Session, job: Job, undo: Callable[[Session, Job], None]) -> None:
    """Send the job id to the broker (after the commit). If the broker refuses, `undo(session, job)`
    takes the change back and the request fails with 503, so a retry (the SDK retries 5xx with
    the same Idempotency-Key) starts over instead of finding a job no worker will ever hear of."""
    from core.broker import enqueue_job

    try:
        enqueue_job(request.app.state.celery, job.id, job.queue)
    except Exception as e:  # any broker failure
        log.exception("could not enqueue job %s", job.id)
        session.rollback()
        session.refresh(job)
        undo(session, job)
        session.commit()
        raise APIError(
            503,
            "The job could not be queued: the broker is unreachable. "
            "Nothing was changed; try again later (GET /readyz shows when the service is ready).",
            code="broker_unavailable",
        ) from e


def undo_create(session: Session, job: Job) -> None:
    session.execute(delete(Event).where(Event.job_id == job.id))
    session.execute(delete(Job).where(Job.id == job.id))


def undo_resume(session: Session, job: Job) -> None:
    if job.status == JobStatus.QUEUED and job.lease_owner is None:
        jobstates.transition(session, job, JobStatus.PAUSED)
