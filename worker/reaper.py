"""The reaper: a daemon thread in every worker process that keeps jobs moving when workers or
messages are lost. Every `reaper_interval_seconds` it

1. **re-queues expired leases**: `core.job_leases.requeue_expired` moves `validating_files`/`running`
   jobs whose lease expired (worker SIGKILLed, machine lost) back to `queued` (or to `failed` with
   `worker_lost` after `max_attempts`), and the reaper sends their message again, to the head of
   the queue: the job keeps its place. Nothing depends on the broker redelivering anything.
2. **re-sends lost messages**, and only those: a job waiting to be claimed (`validating_files`/
   `queued`, nobody holding it) whose message the broker does not hold (core/broker_queues.py
   reads the queues) in two rounds in a row, unchanged in between, lost its message: the API
   crashed between commit and send, the worker that took the message died before claiming it, or
   Redis restarted empty (it keeps nothing on disk here). Jobs merely waiting behind busy workers
   have their message in the queue and are left alone. Two rounds, because a message is briefly
   in neither place while a worker takes it (or while the API sends it); a job whose owner has all
   `max_running_jobs_per_key` slots in use waits for one to free (worker/running_quota.py re-sends
   it then). The reaper bumps the job's `updated_at` with a conditional UPDATE (so of many workers'
   reapers only one re-sends) and sends the message again, to the head of the queue, oldest job
   first. Should a duplicate ever be sent, it is harmless: the claim is atomic and drops it. On a
   broker it cannot read (neither Redis nor kombu's SQL transport), a job waiting unchanged for
   `LOST_MESSAGE_SECONDS` is re-sent, as before.
3. **collects garbage blobs**: incomplete blobs (uploads or checkpoint writes that died half way)
   whose writer's heartbeat is older than `blob_writer_timeout_seconds` are deleted (rows written
   before writers beat: once older than `BLOB_GC_SECONDS`); core/blob_gc.py.
4. **forgets deleted data on this worker's disk**, on the same rounds: the cached copies, tokens
   and tokenizers of files deleted since, and the checkpoints extracted for inference whose blob
   is gone (worker/cache_sweep.py).

Several workers running the reaper at once is fine: every step is an atomic conditional update.
An outage of the database or the broker is logged once when the reaper first fails to reach it
and once when it is back, not at every round.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NotRequired, TypedDict

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core.broker import TRAIN_TASK, enqueue_job
from core.broker_faults import BrokerOutageLog, is_broker_error
from core.broker_queues import UnsupportedBroker, queued_job_ids
from core.db_faults import OutageLog, is_connection_error
from core.job_leases import requeue_expired
from core.models import Job, utcnow
from core.quotas import held_jobs_by_owner
from core.settings import Settings
from core.status import CLAIMABLE
from worker.cache_sweep import sweep_work_dir

if TYPE_CHECKING:
    from celery import Celery

    from core.blobstore import BlobStore

log = logging.getLogger(__name__)

LOST_MESSAGE_SECONDS = 30.0  # only for brokers the reaper cannot read
BLOB_GC_SECONDS = 6 * 3600.0
BLOB_GC_EVERY = 60  # reaper rounds between blob collections


class RoundReport(TypedDict):
    """What one reaper round did (for tests and logs)."""

    requeued: list[str]  # job ids whose expired lease was given back to the queue
    resent: list[str]  # job ids whose lost message was sent again
    blobs: NotRequired[int]  # incomplete blobs deleted (only on the rounds that collect them)
    cached: NotRequired[int]  # this worker's cached entries of deleted files and models removed (same rounds)


@dataclass(frozen=True)
class WaitingJob:
    id: str
    queue: str
    owner_id: str
    updated_at: datetime


_started: dict[str, Reaper] = {}
_lock = threading.Lock()


class Reaper(threading.Thread):
    def __init__(
        self,
        celery: Celery,
        settings: Settings,
        session_factory: sessionmaker[Session],
        store: BlobStore,
        interval: float | None = None,
    ):
        super().__init__(name="fromscratch-reaper", daemon=True)
        self.celery, self.settings = celery, settings
        self.session_factory, self.store = session_factory, store
        self.interval = interval if interval is not None else settings.reaper_interval_seconds
        self.stop_event = threading.Event()
        self.rounds = 0
        self.database = OutageLog("reaper", log)
        self.broker = BrokerOutageLog("reaper", log)
        self._missing: dict[str, datetime] = {}  # job id -> its updated_at when its message was missing

    def run(self) -> None:
        log.info("reaper running every %.1fs", self.interval)
        while not self.stop_event.wait(self.interval):
            try:
                self.run_once()
            except Exception as exc:  # try again next round
                if is_connection_error(exc):
                    self.database.failed(exc)
                else:
                    log.warning("reaper round failed", exc_info=True)
            else:
                self.database.reachable()

    def stop(self) -> None:
        self.stop_event.set()

    def run_once(self) -> RoundReport:
        """One round; returns what it did (job ids, blob count), for tests and logs."""
        done: RoundReport = {"requeued": self.requeue_expired(), "resent": self.resend_lost()}
        self.rounds += 1
        if self.rounds % BLOB_GC_EVERY == 1:
            done["blobs"] = self.collect_blobs()
            done["cached"] = sweep_work_dir(self.session_factory, self.settings.work_path)
        return done

    def requeue_expired(self) -> list[str]:
        if self.database.down or self.database.up_for() < self.settings.lease_seconds:
            # Leases expired while nobody could reach the database: live workers renew theirs at
            # their next heartbeat, so give them a lease's length before calling any of them lost.
            return []
        with self.session_factory() as session:
            requeued = requeue_expired(session, self.settings.max_attempts)  # commits
        for job_id, _ in requeued:
            log.info("job %s: its worker's lease expired; re-queued at the head of the queue", job_id)
        self._send_to_head(requeued)
        return [job_id for job_id, _ in requeued]

    def resend_lost(self) -> list[str]:
        settled = utcnow() - timedelta(seconds=self.interval)  # the API sends right after its commit
        with self.session_factory() as session:
            waiting = self._waiting(session, settled)
        if not waiting:
            self._missing = {}
            return []
        try:
            in_broker = set(
                queued_job_ids(
                    self.celery,
                    TRAIN_TASK,
                    sorted({job.queue for job in waiting}),
                    delivered_within=self.settings.lease_seconds,
                )
            )
        except UnsupportedBroker:
            # cannot tell: a job waiting unchanged for LOST_MESSAGE_SECONDS counts as lost
            cutoff = utcnow() - timedelta(seconds=LOST_MESSAGE_SECONDS)
            in_broker = {job.id for job in waiting if job.updated_at >= cutoff}
        except Exception as exc:
            if not is_broker_error(exc):
                raise
            self.broker.failed(exc)
            return []
        self.broker.reachable()
        missing = {job.id: job.updated_at for job in waiting if job.id not in in_broker}
        lost = [job for job in waiting if job.id in missing and self._missing.get(job.id) == job.updated_at]
        self._missing = missing
        if not lost:
            return []
        with self.session_factory() as session:
            lost = self._owner_has_a_free_slot(session, lost)
            resent = [job for job in lost if self._take_resend(session, job)]
            session.commit()
        for job in resent:
            log.info("job %s: the broker lost its message; re-sending it to the head of the queue", job.id)
        self._send_to_head([(job.id, job.queue) for job in resent])
        return [job.id for job in resent]

    def collect_blobs(self) -> int:
        with self.session_factory() as session:
            n = self.store.gc_incomplete(
                session,
                older_than=timedelta(seconds=BLOB_GC_SECONDS),
                writer_timeout=timedelta(seconds=self.settings.blob_writer_timeout_seconds),
            )
            session.commit()
        if n:
            log.info("deleted %d incomplete blobs", n)
        return n

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _waiting(session: Session, settled: datetime) -> list[WaitingJob]:
        """Jobs waiting to be claimed, oldest first."""
        rows = session.execute(
            select(Job.id, Job.queue, Job.owner_id, Job.updated_at)
            .where(Job.unclaimed(), Job.updated_at < settled)
            .order_by(Job.created_at, Job.id)
        ).all()
        return [WaitingJob(*row) for row in rows]

    def _owner_has_a_free_slot(self, session: Session, jobs: list[WaitingJob]) -> list[WaitingJob]:
        """Drop the jobs whose owner has all `max_running_jobs_per_key` slots in use: sent now, they
        would only be deferred again; the worker that frees a slot re-sends them."""
        held = held_jobs_by_owner(session, {job.owner_id for job in jobs})
        limit = self.settings.max_running_jobs_per_key
        return [job for job in jobs if held.get(job.owner_id, 0) < limit]

    @staticmethod
    def _take_resend(session: Session, job: WaitingJob) -> bool:
        """Of several reapers, the one whose UPDATE matches the job as it was seen re-sends it."""
        result = session.execute(
            update(Job)
            .where(
                Job.id == job.id,
                Job.status.in_(CLAIMABLE),
                Job.lease_owner.is_(None),
                Job.updated_at == job.updated_at,
            )
            .values(updated_at=utcnow())
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def _send_to_head(self, jobs: list[tuple[str, str]]) -> None:
        """Send each (job id, queue), oldest job (first in `jobs`) last: it ends at the very head.
        The first broker failure stops the rest: the lost-message pass re-sends them later."""
        for job_id, queue in reversed(jobs):
            try:
                enqueue_job(self.celery, job_id, queue, front=True)
            except Exception as exc:
                if not is_broker_error(exc):
                    log.warning("could not send job %s to queue %s", job_id, queue, exc_info=True)
                    continue
                self.broker.failed(exc)
                return
            self.broker.reachable()


def start_reaper(celery: Celery, settings: Settings) -> Reaper:
    """Start this process's reaper (once)."""
    from worker.process import resources

    with _lock:
        reaper = _started.get(settings.database_url)
        if reaper is None or not reaper.is_alive():
            res = resources(settings)
            reaper = Reaper(celery, settings, res.session_factory, res.store)
            reaper.start()
            _started[settings.database_url] = reaper
        return reaper
