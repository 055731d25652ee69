"""How a claimed job ends: `JobEnding` holds the claimed job's context (its worker, settings,
database, lease flag and scratch folder) and writes each final state; worker.job_run.JobRun adds
the steps before it.

- succeeded: the final exports and the model's checkpoint (final/: the last step's weights, or the
  best evaluation's when the run ended past it, e.g. stopped early; its step's row is then the final
  one and the last step's stays a listed checkpoint) are stored, and the job is marked succeeded
  (with its results file and, past the best, an event saying which checkpoint is the model) in the
  checkpoint's transaction;
- cancelled or paused: a stop asked for before or during training;
- re-queued: the worker shuts down (`hand_back`, at the head of the queue, not counted), or a rank
  of a distributed run died (counted, like a lost worker: core.job_leases.after_lost_attempt);
- failed: with the error code worker.failures gave;
- given up: the database stayed away past `db_retry_seconds`. The attempt ends, never the job: it
  goes back to the queue and resumes from its last stored checkpoint, like after a crash.

A lost lease (LeaseLost) ends nothing: the job is another worker's."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy.orm import Session

from core import db_faults
from core.broker_faults import describe
from core.job_leases import after_lost_attempt, hand_back
from core.jobstates import add_event, transition
from core.models import Job
from core.naming import checkpoint_model_id, final_model_id
from core.settings import Settings
from core.status import JobStatus
from trainer.distributed.launch import RankLost
from trainer.run.loop import TrainResult
from worker.callbacks import ServiceCallbacks
from worker.checkpoint_store import store_checkpoint
from worker.db_retry import DatabaseUnavailable, DbRetry
from worker.final_exports import store_final_exports
from worker.job_inputs import JobSnapshot
from worker.lease import LeaseLost, lock_held_job
from worker.process import Resources
from worker.result_file import write_result_file

log = logging.getLogger(__name__)


class JobEnding:
    """A claimed job's context and its endings. Each ending returns the status the job ended in,
    or None when it is no longer this worker's to end (lease lost, or the database still away)."""

    def __init__(
        self,
        job_id: str,
        worker_id: str,
        settings: Settings,
        res: Resources,
        lease_lost: threading.Event,
        job_dir: Path,
    ):
        self.job_id, self.worker_id, self.settings = job_id, worker_id, settings
        self.sf, self.store = res.session_factory, res.store
        self.lease_lost = lease_lost
        self.job_dir = job_dir
        self.db = DbRetry("job updates", settings.db_retry_seconds)

    def keep(self, requested: int | None) -> int:
        """Step checkpoints kept in the database: the job's `keep_checkpoints`, at most the
        service's `max_checkpoints_per_job`."""
        cap = self.settings.max_checkpoints_per_job
        return min(requested, cap) if requested else cap

    def held(self, session: Session) -> Job:
        """The job's row, locked, while this worker still holds it (else LeaseLost)."""
        if self.lease_lost.is_set():
            raise LeaseLost(self.job_id)
        return lock_held_job(session, self.job_id, self.worker_id)

    def succeed(self, snapshot: JobSnapshot, result: TrainResult, callbacks: ServiceCallbacks) -> JobStatus:
        """Store the model's checkpoint (final/, of step model_step) as the job's final one and finish
        the job in the same transaction."""
        model_id = final_model_id(snapshot.naming_job)
        final, step = result.final_checkpoint, result.model_step
        assert final is not None and step is not None  # a run that ended as a model (JobRun._end)

        def mark_succeeded(session: Session, job: Job) -> None:
            if result.model_note is not None:  # before the status: a job's last event is its end
                add_event(session, self.job_id, f"{result.model_note}.", data=model_data(result))
            transition(
                session,
                job,
                JobStatus.SUCCEEDED,
                fine_tuned_model=model_id,
                step=result.step,
                trained_tokens=result.tokens_seen,
            )
            write_result_file(session, self.store, job)  # the results CSV commits with the success

        store_final_exports(self, snapshot, final)  # export_formats, stored before the job succeeds
        store_checkpoint(
            self.sf,
            self.store,
            job_id=self.job_id,
            worker_id=self.worker_id,
            step=step,
            folder=final,
            model_id=checkpoint_model_id(snapshot.naming_job, step),
            metrics=callbacks.checkpoint_metrics(step),
            is_final=True,
            keep=self.keep(snapshot.keep_checkpoints),
            extra=mark_succeeded,
            max_stored_bytes=self.settings.max_stored_bytes_per_key,
            retry=callbacks.checkpoint_db,
        )
        log.info("job %s succeeded: %s", self.job_id, model_id)
        return JobStatus.SUCCEEDED

    def finish(self, status: JobStatus, message: str | None = None) -> JobStatus:
        def write() -> None:
            with self.sf() as session:
                transition(session, self.held(session), status)
                session.commit()

        self.db.call(write)
        log.info("job %s %s%s", self.job_id, status, f": {message}" if message else "")
        return status

    def requeue_for_shutdown(self, queue: str, step: int | None) -> JobStatus:
        with self.sf() as session:
            job = self.held(session)
            hand_back(session, job)  # not a failed attempt
            session.commit()
        log.info(
            "worker shutting down: job %s re-queued at the head of the queue%s",
            self.job_id,
            f" from step {step}" if step is not None else "",
        )
        self._send_again(queue, front=True)
        return JobStatus.QUEUED

    def requeue_lost_rank(self, exc: RankLost) -> JobStatus | None:
        """A rank of a distributed run died (killed, out of memory): the attempt is dead, like a
        worker that died, and counted as one. The job goes back to the head of its queue and
        resumes from its last stored checkpoint, or fails with `worker_lost` after max_attempts;
        a cancel or pause asked for meanwhile is honoured instead (paused: it resumes from there)."""
        max_attempts = self.settings.max_attempts

        def write() -> tuple[JobStatus, str]:
            with self.sf() as session:
                job = self.held(session)
                status = after_lost_attempt(job, max_attempts)  # the reaper's rule for a lost worker
                if status in (JobStatus.CANCELLED, JobStatus.PAUSED):
                    transition(session, job, status)
                elif status == JobStatus.QUEUED:
                    transition(session, job, JobStatus.QUEUED)
                    add_event(
                        session,
                        self.job_id,
                        f"The {exc}; the job goes back to the queue and resumes from its last "
                        f"checkpoint (attempt {job.attempts + 1} of {max_attempts})",
                        level="warn",
                        data={"attempt": job.attempts + 1, "max_attempts": max_attempts, "rank": exc.rank},
                    )
                else:
                    transition(
                        session,
                        job,
                        JobStatus.FAILED,
                        error_code="worker_lost",
                        error_message=(
                            f"A training process died on each of {job.attempts} attempts "
                            f"(max_attempts={max_attempts}), the last time: {exc}. Check the worker's "
                            "logs (out of memory? killed?), then start a new job."
                        ),
                    )
                session.commit()
                return status, job.queue

        try:
            status, queue = self.db.call(write)
        except LeaseLost:
            return None
        except DatabaseUnavailable as error:
            return self.give_up(error)
        log.warning("job %s: %s; %s", self.job_id, exc, status)
        if status == JobStatus.QUEUED:
            self._send_again(queue, front=True)
        return status

    def fail(self, code: str, message: str, param: str | None = None) -> JobStatus | None:
        def write() -> None:
            with self.sf() as session:
                job = self.held(session)
                transition(
                    session, job, JobStatus.FAILED, error_code=code, error_message=message, error_param=param
                )
                session.commit()

        try:
            self.db.call(write)
        except LeaseLost:
            log.warning("job %s: lease lost before its failure (%s) could be recorded", self.job_id, code)
            return None
        except DatabaseUnavailable as exc:  # the next attempt meets the failure again and records it
            return self.give_up(exc)
        return JobStatus.FAILED

    def give_up(self, exc: Exception) -> JobStatus | None:
        """End this attempt, not the job: the database stayed unreachable past db_retry_seconds (or
        failed where nothing retries). If it answers now the job is handed back to the queue
        without counting the attempt (an outage is not the job's failure); otherwise its lease
        lapses and a reaper re-queues it once the database is back (counted, like a crash).
        Either way it resumes from its last stored checkpoint."""
        log.warning("job %s: giving this attempt up (%s)", self.job_id, db_faults.describe(exc))
        try:
            with self.sf() as session:
                job = self.held(session)
                attempts = max(job.attempts - 1, 0)
                if job.status == JobStatus.QUEUED:  # claimed, not started: give the claim back
                    job.lease_owner, job.lease_expires_at, job.attempts = None, None, attempts
                else:
                    transition(session, job, JobStatus.QUEUED, attempts=attempts)
                away = exc.what if isinstance(exc, DatabaseUnavailable) else "the database"
                add_event(
                    session,
                    self.job_id,
                    f"{away[0].upper()}{away[1:]} was unreachable for too long: the job goes back to the "
                    "queue and resumes from its last checkpoint",
                    level="warn",
                )
                session.commit()
                queue = job.queue
        except Exception as error:  # still down (or the lease is gone): the reapers take it from here
            reason = db_faults.describe(error)
            log.warning("job %s: not handed back (%s); its lease will lapse", self.job_id, reason)
            return None
        self._send_again(queue)
        return JobStatus.QUEUED

    def _send_again(self, queue: str, *, front: bool = False) -> None:
        """The job's message, for the job handed back to `queue` (front: it keeps its place)."""
        try:
            from worker.celery_app import enqueue_job

            enqueue_job(self.job_id, queue, front=front)
        except Exception as error:  # the reaper re-sends the messages the broker does not hold
            log.warning("could not re-send job %s (%s); the reaper will", self.job_id, describe(error))


def model_data(result: TrainResult) -> dict[str, object]:
    """The numbers of the event that says which checkpoint is the model (TrainResult.model_note)."""
    return {
        "stop_reason": result.stop_reason,
        "step": result.step,
        "model_step": result.model_step,
        "best_step": result.best_step,
        "best_val_loss": result.best_val_loss,
        "evaluations_since_best": result.evals_since_best,
    }
