"""`JobRun`: one claimed job from its inputs to its final state (steps 3-6 of worker.runner's
docstring), each step a method: read the job, honour early stop requests, prepare the inputs, mark
it running, train, and end it as succeeded, paused, cancelled, re-queued or failed.

Every database write is retried through a brief outage (worker.db_retry: `self.db` here, the
metrics and checkpoint writes in worker.callbacks). When the database stays away longer than
`db_retry_seconds` the attempt is given up (`_give_up`), never the job: it goes back to the queue
and resumes from its last stored checkpoint, like after a crash."""

from __future__ import annotations

import contextlib
import logging
import threading
import traceback
from pathlib import Path

from sqlalchemy.orm import Session

from core import db_faults
from core.broker_faults import describe
from core.jobstates import add_event, after_lost_attempt, hand_back, transition
from core.models import Job
from core.naming import checkpoint_model_id, final_model_id
from core.settings import Settings
from core.status import JobStatus
from trainer.distributed.launch import RankLost
from trainer.run.loop import TrainResult, train
from worker.callbacks import ServiceCallbacks
from worker.checkpoint_store import store_checkpoint
from worker.db_retry import DatabaseUnavailable, DbRetry
from worker.distributed_job import train_distributed
from worker.failures import JobFailure, classify_exception
from worker.final_exports import store_final_exports
from worker.integrations import TrackedCallbacks, Trackers, start_trackers
from worker.job_inputs import JobSnapshot, TrainingInputs, prepare_inputs
from worker.lease import LeaseLost, lock_held_job
from worker.metric_rows import delete_metrics_after
from worker.process import Resources, shutdown_event
from worker.result_file import write_result_file

log = logging.getLogger(__name__)


class JobRun:
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
        self.cache_dir = settings.work_path / "cache"
        self.db = DbRetry("job updates", settings.db_retry_seconds)
        self.trackers = Trackers.none()  # the job's integrations, started once it runs

    # ------------------------------------------------------------------ top level
    def run(self) -> JobStatus | None:
        """The status the job ended in; None when the lease was lost (the job is another worker's)."""
        status = self._attempt()
        final = self.job_dir / "run" / "final" if status == JobStatus.SUCCEEDED else None
        self.trackers.finish(status, final)  # after the job's final state: a tracker never holds it up
        return status

    def _attempt(self) -> JobStatus | None:
        try:
            return self._run()
        except LeaseLost:
            log.warning("job %s: lease lost; leaving the job to its new owner", self.job_id)
            return None
        except DatabaseUnavailable as exc:
            return self._give_up(exc)
        except JobFailure as exc:
            return self._fail(exc.code, exc.message, exc.param)
        except RankLost as exc:
            return self._requeue_lost_rank(exc)
        except Exception as exc:
            if db_faults.is_connection_error(exc):  # where no retry covers: not the job's fault
                return self._give_up(exc)
            failure = classify_exception(exc)
            if failure.code == "internal_error":
                log.error("job %s failed with an internal error\n%s", self.job_id, traceback.format_exc())
            else:
                log.info("job %s failed: %s: %s", self.job_id, failure.code, failure.message)
            return self._fail(failure.code, failure.message, failure.param)

    def _run(self) -> JobStatus | None:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        snapshot = self._read_snapshot()
        if (stopped := self._requested_stop()) is not None:
            return stopped
        inputs = self.db.call(  # downloads and caches: safe to run again after a dropped connection
            lambda: prepare_inputs(
                self.sf,
                self.store,
                job_id=self.job_id,
                snapshot=snapshot,
                cache_dir=self.cache_dir,
                job_dir=self.job_dir,
                device_setting=self.settings.device,
            )
        )
        if (stopped := self._requested_stop()) is not None:  # preparing the data may take a while
            return stopped
        self._mark_running(inputs)
        self.trackers = start_trackers(snapshot.naming_job, inputs, self.settings, self.sf)
        callbacks = self._callbacks(snapshot, inputs)
        result = self._train(inputs, callbacks)
        return self._end(snapshot, result, callbacks)

    # ------------------------------------------------------------------ steps
    def _read_snapshot(self) -> JobSnapshot:
        def read() -> JobSnapshot:
            with self.sf() as session:
                return JobSnapshot.of(self._held(session), session)

        return self.db.call(read)

    def _requested_stop(self) -> JobStatus | None:
        """Honour cancel/pause/shutdown that arrived before training started."""

        def read() -> tuple[bool, bool]:
            with self.sf() as session:
                job = self._held(session)
                return job.cancel_requested, job.pause_requested

        cancel, pause = self.db.call(read)
        if cancel:
            return self._finish(JobStatus.CANCELLED)
        if pause:
            return self._finish(JobStatus.PAUSED, message="Paused before training started")
        if shutdown_event.is_set():
            with self.sf() as session:
                return self._requeue_for_shutdown(self._held(session).queue, None)
        return None

    def _mark_running(self, inputs: TrainingInputs) -> None:
        """Move the job to running; when resuming, first drop the metric rows after the checkpoint
        (training logs them again) and record the resume as an event."""
        resumed = inputs.resume_path is not None
        step = inputs.resume_step if resumed else 0

        def write() -> None:
            with self.sf() as session:
                job = self._held(session)
                deleted = delete_metrics_after(session, self.job_id, step if resumed else -1)
                if resumed:
                    message = f"Resuming from the checkpoint at step {step}"
                    if deleted:
                        message += f" ({deleted} metric rows after it will be logged again)"
                    log.info("job %s: %s", self.job_id, message)
                    add_event(session, self.job_id, message, data={"step": step})
                transition(session, job, JobStatus.RUNNING, step=step)
                session.commit()

        self.db.call(write)

    def _callbacks(self, snapshot: JobSnapshot, inputs: TrainingInputs) -> ServiceCallbacks:
        return TrackedCallbacks(
            self.sf,
            self.store,
            job_id=self.job_id,
            worker_id=self.worker_id,
            checkpoint_model_id=lambda step: checkpoint_model_id(snapshot.naming_job, step),
            scratch=self.job_dir,
            flush_seconds=self.settings.metrics_flush_seconds,
            keep_checkpoints=self._keep(inputs.train_cfg.keep_checkpoints),
            max_stored_bytes=self.settings.max_stored_bytes_per_key,
            lease_lost=self.lease_lost,
            shutdown=shutdown_event,
            db_retry_seconds=self.settings.db_retry_seconds,
            trackers=self.trackers,
        )

    def _train(self, inputs: TrainingInputs, callbacks: ServiceCallbacks) -> TrainResult:
        # the run's own rotation (this worker's disk) keeps no more than the database does
        keep = self._keep(inputs.train_cfg.keep_checkpoints)
        train_cfg = inputs.train_cfg.model_copy(update={"keep_checkpoints": keep})
        try:
            if train_cfg.devices > 1:
                result = train_distributed(inputs, train_cfg, self.job_dir / "run", callbacks)
            else:
                result = train(
                    inputs.model_cfg,
                    train_cfg,
                    inputs.data,
                    self.job_dir / "run",
                    callbacks,
                    tokenizer=inputs.tokenizer,
                    resume=inputs.resume_path or False,
                    init_from=inputs.init_from,
                )
        except BaseException:
            with contextlib.suppress(DatabaseUnavailable):
                callbacks.flush()  # the rows logged before the failure, if the database takes them now
            raise
        callbacks.flush(wait=True)
        if callbacks.cause == "lease_lost" or self.lease_lost.is_set():
            raise LeaseLost(self.job_id)
        return result

    def _end(self, snapshot: JobSnapshot, result: TrainResult, callbacks: ServiceCallbacks) -> JobStatus:
        """The job's state after training returned: what stopped it decides."""
        if result.stop_reason in ("completed", "time_limit"):
            final = result.final_checkpoint
            if final is None:
                raise JobFailure("internal_error", "Training ended without a final checkpoint.")
            return self._succeed(snapshot, final, result.step, result.tokens_seen, callbacks)
        if callbacks.cause == "cancel":
            return self._finish(JobStatus.CANCELLED)
        if callbacks.cause == "pause":
            return self._finish(JobStatus.PAUSED, message=f"Paused at step {result.step}")
        if callbacks.cause == "shutdown":
            return self._requeue_for_shutdown(snapshot.queue, result.step)
        raise JobFailure("internal_error", f"Training stopped unexpectedly ({result.stop_reason}).")

    def _keep(self, requested: int | None) -> int:
        """Step checkpoints kept in the database: the job's `keep_checkpoints`, at most the
        service's `max_checkpoints_per_job`."""
        cap = self.settings.max_checkpoints_per_job
        return min(requested, cap) if requested else cap

    def _held(self, session: Session) -> Job:
        if self.lease_lost.is_set():
            raise LeaseLost(self.job_id)
        return lock_held_job(session, self.job_id, self.worker_id)

    # ------------------------------------------------------------------ endings
    def _succeed(
        self, snapshot: JobSnapshot, final: Path, step: int, tokens: int, callbacks: ServiceCallbacks
    ) -> JobStatus:
        """Store the final checkpoint and finish the job in the same transaction."""
        model_id = final_model_id(snapshot.naming_job)

        def finish(session: Session, job: Job) -> None:
            transition(
                session, job, JobStatus.SUCCEEDED, fine_tuned_model=model_id, step=step, trained_tokens=tokens
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
            keep=self._keep(snapshot.keep_checkpoints),
            scratch=self.job_dir,
            extra=finish,
            max_stored_bytes=self.settings.max_stored_bytes_per_key,
            retry=callbacks.checkpoint_db,
        )
        log.info("job %s succeeded: %s", self.job_id, model_id)
        return JobStatus.SUCCEEDED

    def _finish(self, status: JobStatus, message: str | None = None) -> JobStatus:
        def write() -> None:
            with self.sf() as session:
                transition(session, self._held(session), status)
                session.commit()

        self.db.call(write)
        log.info("job %s %s%s", self.job_id, status, f": {message}" if message else "")
        return status

    def _requeue_for_shutdown(self, queue: str, step: int | None) -> JobStatus:
        with self.sf() as session:
            job = self._held(session)
            hand_back(session, job)  # not a failed attempt
            session.commit()
        log.info(
            "worker shutting down: job %s re-queued at the head of the queue%s",
            self.job_id,
            f" from step {step}" if step is not None else "",
        )
        self._send_again(queue, front=True)
        return JobStatus.QUEUED

    def _requeue_lost_rank(self, exc: RankLost) -> JobStatus | None:
        """A rank of a distributed run died (killed, out of memory): the attempt is dead, like a
        worker that died, and counted as one. The job goes back to the head of its queue and
        resumes from its last stored checkpoint, or fails with `worker_lost` after max_attempts;
        a cancel or pause asked for meanwhile is honoured instead (paused: it resumes from there)."""
        max_attempts = self.settings.max_attempts

        def write() -> tuple[JobStatus, str]:
            with self.sf() as session:
                job = self._held(session)
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
            return self._give_up(error)
        log.warning("job %s: %s; %s", self.job_id, exc, status)
        if status == JobStatus.QUEUED:
            self._send_again(queue, front=True)
        return status

    def _fail(self, code: str, message: str, param: str | None = None) -> JobStatus | None:
        def write() -> None:
            with self.sf() as session:
                job = self._held(session)
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
            return self._give_up(exc)
        return JobStatus.FAILED

    def _give_up(self, exc: Exception) -> JobStatus | None:
        """End this attempt, not the job: the database stayed unreachable past db_retry_seconds (or
        failed where nothing retries). If it answers now the job is handed back to the queue
        without counting the attempt (an outage is not the job's failure); otherwise its lease
        lapses and a reaper re-queues it once the database is back (counted, like a crash).
        Either way it resumes from its last stored checkpoint."""
        log.warning("job %s: giving this attempt up (%s)", self.job_id, db_faults.describe(exc))
        try:
            with self.sf() as session:
                job = self._held(session)
                attempts = max(job.attempts - 1, 0)
                if job.status == JobStatus.QUEUED:  # claimed, not started: give the claim back
                    job.lease_owner, job.lease_expires_at, job.attempts = None, None, attempts
                else:
                    transition(session, job, JobStatus.QUEUED, attempts=attempts)
                add_event(
                    session,
                    self.job_id,
                    "The database was unreachable for too long: the job goes back to the queue and "
                    "resumes from its last checkpoint",
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
