"""This worker's hold on a job: the atomic claim (`claim`), the `Heartbeat` thread that keeps the
lease alive while the job runs (flagging `lost` when the reaper has given the job away), and
`lock_held_job`: the job row, locked for a transaction that changes the job, or `LeaseLost` when
another worker may own the job now."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db_faults import OutageLog, is_connection_error
from core.job_leases import claim_job, renew_lease
from core.models import Job
from core.quotas import held_jobs, lock_owner
from worker.fair_pick import fairest_waiting
from worker.running_quota import defer_if_owner_busy

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """This worker no longer holds the job's lease: another worker may own it now."""


def claim(
    session_factory: sessionmaker[Session],
    job_id: str,
    worker_id: str,
    lease_seconds: float,
    max_running_per_owner: int,
) -> str | None:
    """Claim a job for `worker_id` (committed), taking the message that names `job_id`: the fairest
    job waiting on its queue (worker/fair_pick.py), which may be another one; then `job_id`'s
    message goes back to the head of the queue. Returns the claimed job's id, or None when nothing
    is claimed: `job_id` is running elsewhere, finished, paused or unknown, or its owner already
    has `max_running_per_owner` jobs running (deferred: worker/running_quota.py); the caller drops
    the message."""
    with session_factory() as session:
        named = session.get(Job, job_id)
        waiting = named is not None and named.is_unclaimed
        queue = named.queue if named is not None else ""
        # a replayed or stale message (its job started, ended or paused) starts nothing
        candidates = fairest_waiting(session, queue, max_running_per_owner) if waiting else []
    for candidate in candidates:
        if _claim_under_quota(session_factory, candidate, worker_id, lease_seconds, max_running_per_owner):
            if candidate != job_id:
                log.info(
                    "job %s: starting %s instead, the fairest job waiting on %s", job_id, candidate, queue
                )
                _send_back(job_id, queue)
            return candidate
    with session_factory() as session:  # none could start: the named job waits, or is not claimable
        if defer_if_owner_busy(session, job_id, max_running_per_owner):
            session.commit()
            return None
        job = claim_job(session, job_id, worker_id, lease_seconds)  # under the owner's quota lock
        if job is None:
            session.rollback()
            log.info(
                "job %s is not claimable (running elsewhere, finished, paused or unknown): "
                "dropping the message",
                job_id,
            )
            return None
        session.commit()
        log.info("claimed job %s (attempt %s) as %s", job_id, job.attempts, worker_id)
        return job_id


def _claim_under_quota(
    session_factory: sessionmaker[Session],
    job_id: str,
    worker_id: str,
    lease_seconds: float,
    max_running: int,
) -> bool:
    """Claim `job_id` if its owner has a free running slot, checked under the owner's quota lock;
    False (nothing written) when another worker took it or the slot first."""
    with session_factory() as session:
        owner_id = session.scalar(select(Job.owner_id).where(Job.id == job_id))
        if owner_id is None:
            return False
        lock_owner(session, owner_id)
        if held_jobs(session, owner_id) >= max_running:
            session.rollback()
            return False
        job = claim_job(session, job_id, worker_id, lease_seconds)
        if job is None:
            return False
        log.info("claimed job %s (attempt %s) as %s", job_id, job.attempts, worker_id)
        return True


def hand_back_message(session_factory: sessionmaker[Session], job_id: str) -> None:
    """A message taken while this worker shuts down: its job, still waiting, is left unclaimed and
    its message goes back to the head of the queue, for another worker (or this one, restarted).
    Claimed, it would only be handed back again, with a second 'worker shut down' event."""
    with session_factory() as session:
        job = session.get(Job, job_id)
        waiting = job is not None and job.is_unclaimed
        queue = job.queue if job is not None else ""
    if waiting:
        log.info("worker shutting down: job %s left to another worker", job_id)
        _send_back(job_id, queue)


def _send_back(job_id: str, queue: str) -> None:
    """The message of a job still waiting goes back to the head of its queue (it had its turn);
    should the broker fail, the reaper's lost-message pass sends it later."""
    try:
        from worker.celery_app import enqueue_job

        enqueue_job(job_id, queue, front=True)
    except Exception:
        log.warning("could not send job %s back to %s; the reaper will", job_id, queue, exc_info=True)


class Heartbeat(threading.Thread):
    """Renews the job's lease every `interval` seconds; sets `lost` when the lease is gone."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        job_id: str,
        worker_id: str,
        lease_seconds: float,
        interval: float,
    ):
        super().__init__(name=f"heartbeat-{job_id}", daemon=True)
        self.session_factory, self.job_id, self.worker_id = session_factory, job_id, worker_id
        self.lease_seconds, self.interval = lease_seconds, interval
        self.lost = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        # A database outage: tried again every beat, logged once. Never given up here: the job's
        # writes give the attempt up (worker/db_retry.py), and the reapers leave a lease that expired
        # during an outage to its worker's next beat (worker/reaper.py).
        outage = OutageLog(f"heartbeat of {self.job_id}", log)
        while not self._stop_event.wait(self.interval):
            try:
                with self.session_factory() as session:
                    ok = renew_lease(session, self.job_id, self.worker_id, self.lease_seconds)
                    session.commit()
            except Exception as error:  # try again next beat (the lease has slack)
                if is_connection_error(error):
                    outage.failed(error)
                else:
                    log.warning("heartbeat for %s failed", self.job_id, exc_info=True)
                continue
            outage.reachable()
            if not ok:
                log.warning("job %s: lease lost (another worker may own it now)", self.job_id)
                self.lost.set()
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


def lock_held_job(session: Session, job_id: str, worker_id: str) -> Job:
    """The job row, locked for this transaction, if this worker still holds its lease."""
    job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
    if job is None or job.lease_owner != worker_id:
        raise LeaseLost(job_id)
    return job
