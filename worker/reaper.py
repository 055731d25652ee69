"""The reaper: a daemon thread in every worker process that keeps jobs moving when workers or
messages are lost. Every `reaper_interval_seconds` it

1. **re-queues expired leases**: `core.jobstates.requeue_expired` moves `validating_files`/`running`
   jobs whose lease expired (worker SIGKILLed, machine lost) back to `queued` (or to `failed` with
   `worker_lost` after `max_attempts`), and the reaper sends their message again. Nothing depends
   on the broker redelivering anything.
2. **re-sends lost messages**: a job in `validating_files`/`queued` that nobody holds and that has
   not changed for `LOST_MESSAGE_SECONDS` probably lost its message (the API crashed between commit
   and send, the broker lost it). The reaper bumps the job's `updated_at` with a conditional UPDATE
   (so of many workers' reapers only one re-sends per period) and sends the message again. A
   duplicate is harmless: the claim is atomic and the extra message is dropped.
3. **collects garbage blobs**: incomplete blobs older than `BLOB_GC_SECONDS` (uploads or
   checkpoint writes that died half way) are deleted.

Several workers running the reaper at once is fine: every step is an atomic conditional update.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, NotRequired, TypedDict

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core.jobstates import requeue_expired
from core.models import Job, utcnow
from core.settings import Settings
from core.status import CLAIMABLE

if TYPE_CHECKING:
    from celery import Celery

    from core.blobstore import BlobStore

log = logging.getLogger(__name__)

LOST_MESSAGE_SECONDS = 30.0
BLOB_GC_SECONDS = 6 * 3600.0
BLOB_GC_EVERY = 60  # reaper rounds between blob collections


class RoundReport(TypedDict):
    """What one reaper round did (for tests and logs)."""

    requeued: list[str]  # job ids whose expired lease was given back to the queue
    resent: list[str]  # job ids whose message was sent again
    blobs: NotRequired[int]  # incomplete blobs deleted (only on the rounds that collect them)


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

    def run(self) -> None:
        log.info("reaper running every %.1fs", self.interval)
        while not self.stop_event.wait(self.interval):
            try:
                self.run_once()
            except Exception:  # the database may be briefly unreachable: try again next round
                log.warning("reaper round failed", exc_info=True)

    def stop(self) -> None:
        self.stop_event.set()

    def run_once(self) -> RoundReport:
        """One round; returns what it did (job ids, blob count), for tests and logs."""
        done: RoundReport = {"requeued": self.requeue_expired(), "resent": self.resend_lost()}
        self.rounds += 1
        if self.rounds % BLOB_GC_EVERY == 1:
            done["blobs"] = self.collect_blobs()
        return done

    def requeue_expired(self) -> list[str]:
        with self.session_factory() as session:
            requeued = requeue_expired(session, self.settings.max_attempts)  # commits
        for job_id, queue in requeued:
            log.info("job %s: its worker's lease expired; re-queued", job_id)
            self._send(job_id, queue)
        return [job_id for job_id, _ in requeued]

    def resend_lost(self) -> list[str]:
        cutoff = utcnow() - timedelta(seconds=LOST_MESSAGE_SECONDS)
        resent = []
        with self.session_factory() as session:
            candidates = session.execute(
                select(Job.id, Job.queue).where(
                    Job.status.in_(CLAIMABLE), Job.lease_owner.is_(None), Job.updated_at < cutoff
                )
            ).all()
            for job_id, queue in candidates:
                result = session.execute(
                    update(Job)
                    .where(
                        Job.id == job_id,
                        Job.status.in_(CLAIMABLE),
                        Job.lease_owner.is_(None),
                        Job.updated_at < cutoff,
                    )
                    .values(updated_at=utcnow())
                )
                if result.rowcount:  # type: ignore[attr-defined]
                    resent.append((job_id, queue))
            session.commit()
        for job_id, queue in resent:
            log.info(
                "job %s waited %.0fs with nobody holding it: re-sending its message",
                job_id,
                LOST_MESSAGE_SECONDS,
            )
            self._send(job_id, queue)
        return [job_id for job_id, _ in resent]

    def collect_blobs(self) -> int:
        with self.session_factory() as session:
            n = self.store.gc_incomplete(session, older_than=timedelta(seconds=BLOB_GC_SECONDS))
            session.commit()
        if n:
            log.info("deleted %d incomplete blobs", n)
        return n

    def _send(self, job_id: str, queue: str) -> None:
        from core.broker import enqueue_job

        try:
            enqueue_job(self.celery, job_id, queue)
        except Exception:  # the lost-message pass retries later
            log.warning("could not send job %s to queue %s", job_id, queue, exc_info=True)


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
