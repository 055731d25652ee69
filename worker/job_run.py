"""`JobRun`: one claimed job from its inputs to its final state (steps 3-6 of worker.runner's
docstring), each step a method: read the job, honour early stop requests, prepare the inputs, mark
it running, train, and end it as succeeded, paused, cancelled, re-queued or failed (the endings:
worker.job_ending.JobEnding, which JobRun extends).

Every database write is retried through a brief outage (worker.db_retry: `self.db` here, the
metrics and checkpoint writes in worker.callbacks). When the database stays away longer than
`db_retry_seconds` the attempt is given up (`give_up`), never the job: it goes back to the queue
and resumes from its last stored checkpoint, like after a crash."""

from __future__ import annotations

import contextlib
import logging
import threading
import traceback
from pathlib import Path

from core.blobstore import is_store_outage
from core.jobstates import add_event, transition
from core.naming import checkpoint_model_id
from core.settings import Settings
from core.status import JobStatus
from trainer.distributed.launch import RankLost
from trainer.run.loop import TrainResult, train
from trainer.run.report import ENDS_AS_MODEL
from worker.callbacks import ServiceCallbacks
from worker.db_retry import DatabaseUnavailable
from worker.distributed_job import train_distributed
from worker.failures import JobFailure, classify_exception
from worker.integrations import TrackedCallbacks, Trackers, start_trackers
from worker.job_ending import JobEnding
from worker.job_inputs import JobSnapshot, TrainingInputs, prepare_inputs
from worker.lease import LeaseLost
from worker.metric_rows import delete_metrics_after
from worker.process import Resources, shutdown_event

log = logging.getLogger(__name__)


class JobRun(JobEnding):
    def __init__(
        self,
        job_id: str,
        worker_id: str,
        settings: Settings,
        res: Resources,
        lease_lost: threading.Event,
        job_dir: Path,
    ):
        super().__init__(job_id, worker_id, settings, res, lease_lost, job_dir)
        self.cache_dir = settings.work_path / "cache"
        self.trackers = Trackers.none()  # the job's integrations, started once it runs
        self.has_validation_file = False  # known once the job is read: which input a DataError names

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
            return self.give_up(exc)
        except JobFailure as exc:
            return self.fail(exc.code, exc.message, exc.param)
        except RankLost as exc:
            return self.requeue_lost_rank(exc)
        except Exception as exc:
            if is_store_outage(exc):  # the database or S3 away where no retry covers: not the job's fault
                return self.give_up(exc)
            failure = classify_exception(exc, self.has_validation_file)
            if failure.code == "internal_error":
                log.error("job %s failed with an internal error\n%s", self.job_id, traceback.format_exc())
            else:
                log.info("job %s failed: %s: %s", self.job_id, failure.code, failure.message)
            return self.fail(failure.code, failure.message, failure.param)

    def _run(self) -> JobStatus | None:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        snapshot = self._read_snapshot()
        self.has_validation_file = snapshot.validation_file is not None
        self._mark_validating(snapshot)
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
                return JobSnapshot.of(self.held(session), session)

        return self.db.call(read)

    def _mark_validating(self, snapshot: JobSnapshot) -> None:
        """queued -> validating_files: the job waited for a worker until now (`queued`), and this
        worker validates (and tokenizes) its files next. A job cancelled meanwhile stays cancelled
        (core.jobstates.transition); a row from before this rule may already read validating_files."""
        message = f"Validating training file: {snapshot.training_file}"
        if snapshot.validation_file:
            message += f" and validation file: {snapshot.validation_file}"

        def write() -> None:
            with self.sf() as session:
                job = self.held(session)
                if job.status != JobStatus.QUEUED:
                    return
                transition(session, job, JobStatus.VALIDATING_FILES)
                add_event(session, self.job_id, message)
                session.commit()

        self.db.call(write)

    def _requested_stop(self) -> JobStatus | None:
        """Honour cancel/pause/shutdown that arrived before training started."""

        def read() -> tuple[bool, bool]:
            with self.sf() as session:
                job = self.held(session)
                return job.cancel_requested, job.pause_requested

        cancel, pause = self.db.call(read)
        if cancel:
            return self.finish(JobStatus.CANCELLED)
        if pause:
            return self.finish(JobStatus.PAUSED, message="Paused before training started")
        if shutdown_event.is_set():
            with self.sf() as session:
                return self.requeue_for_shutdown(self.held(session).queue, None)
        return None

    def _mark_running(self, inputs: TrainingInputs) -> None:
        """Move the job to running; when resuming, first drop the metric rows after the checkpoint
        (training logs them again) and record the resume as an event; a continued model's start
        from its parent's weights is an event too. The job's model config takes the vocabulary
        the tokenizer has (the API checks token ids against it)."""
        resumed = inputs.resume_path is not None
        step = inputs.resume_step if resumed else 0

        def write() -> None:
            with self.sf() as session:
                job = self.held(session)
                deleted = delete_metrics_after(session, self.job_id, step if resumed else -1)
                if resumed:
                    message = f"Resuming from the checkpoint at step {step}"
                    if deleted:
                        message += f" ({deleted} metric rows after it will be logged again)"
                    log.info("job %s: %s", self.job_id, message)
                    add_event(session, self.job_id, message, data={"step": step})
                elif inputs.init_from is not None:  # continued training: say from which model
                    message = f"Starting from the weights of {job.base_model_id}"
                    add_event(session, self.job_id, message, data={"base_model": job.base_model_id})
                learned = inputs.tokenizer.vocab_size
                if job.model_config.get("vocab_size") != learned:  # a BPE that found fewer merges
                    job.model_config = {**job.model_config, "vocab_size": learned}
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
            keep_checkpoints=self.keep(inputs.train_cfg.keep_checkpoints),
            max_stored_bytes=self.settings.max_stored_bytes_per_key,
            lease_lost=self.lease_lost,
            shutdown=shutdown_event,
            db_retry_seconds=self.settings.db_retry_seconds,
            trackers=self.trackers,
        )

    def _train(self, inputs: TrainingInputs, callbacks: ServiceCallbacks) -> TrainResult:
        # the run's own rotation (this worker's disk) keeps no more than the database does
        keep = self.keep(inputs.train_cfg.keep_checkpoints)
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
            callbacks.uploads.close()  # the upload in flight ends; the failure is the one to report
            with contextlib.suppress(DatabaseUnavailable):
                callbacks.flush()  # the rows logged before the failure, if the database takes them now
            raise
        callbacks.wait_for_uploads(result.checkpoint_times)  # the end needs every checkpoint stored
        callbacks.flush(wait=True)
        if callbacks.cause == "lease_lost" or self.lease_lost.is_set():
            raise LeaseLost(self.job_id)
        return result

    def _end(self, snapshot: JobSnapshot, result: TrainResult, callbacks: ServiceCallbacks) -> JobStatus:
        """The job's state after training returned: what stopped it decides."""
        if result.stop_reason in ENDS_AS_MODEL:
            if result.final_checkpoint is None or result.model_step is None:
                raise JobFailure("internal_error", "Training ended without a final checkpoint.")
            return self.succeed(snapshot, result, callbacks)
        if callbacks.cause == "cancel":
            return self.finish(JobStatus.CANCELLED)
        if callbacks.cause == "pause":
            return self.finish(JobStatus.PAUSED, message=f"Paused at step {result.step}")
        if callbacks.cause == "shutdown":
            return self.requeue_for_shutdown(snapshot.queue, result.step)
        raise JobFailure("internal_error", f"Training stopped unexpectedly ({result.stop_reason}).")
