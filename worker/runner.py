"""Run one training job inside a worker process: `run_job(job_id, settings)`.

The Celery message carries only the job id; everything else is read from the database here, so a
replayed or duplicated message is harmless:

1. **Claim.** `core.jobstates.claim_job` is an atomic conditional UPDATE that only succeeds for a
   job in `validating_files`/`queued` that nobody holds. `None` means the job is running elsewhere,
   finished, paused or cancelled: the message is logged and dropped.
2. **Lease.** A heartbeat thread renews the lease every `heartbeat_seconds`. If a renewal finds the
   lease gone (the reaper gave the job away after this worker stalled), training stops at the next
   step and this worker writes nothing more for the job.
3. **Files.** The training/validation files are downloaded from the blob store into
   `work_dir/cache/files/<sha256>` (once per content) and validated while the job is
   `validating_files`. The tokenizer is cached per (file sha256, tokenizer kind, vocab_size) under
   `work_dir/cache/tokenizers/`, the tokenized data per (file sha256, tokenizer hash) under
   `work_dir/cache/tokens/` (see `trainer.data.prepare_data`).
4. **Start or resume.** The newest stored Checkpoint of the job (a tar in the blob store) is
   extracted and training resumes from it; metric rows after its step are deleted first so the
   series never has duplicate steps. A job with `base_model_id` ("continue training" a model this
   owner trained before) starts from that model's final checkpoint (`init_from`: weights, tokenizer
   and architecture, fresh optimizer).
5. **Train** with `worker.callbacks.ServiceCallbacks` (metrics in batches, checkpoints to the blob
   store, cancel/pause between steps).
6. **Finish.** Completed: the final checkpoint is stored as a Checkpoint row with `is_final`, the
   job gets `fine_tuned_model` (`core.naming.final_model_id`) and becomes `succeeded`, in one
   transaction. Paused: `paused` (its checkpoint is already stored). Cancelled: `cancelled`.
   Worker shutting down (SIGTERM/Ctrl-C): the job checkpoints, goes back to `queued` and is
   re-sent, instead of making the shutdown wait for a long run.

Exports (GGUF, Hugging Face, ONNX) are *not* produced here: the API converts the final checkpoint
on the first download of each format and keeps the result (an Export row), so a job finishes as soon
as training does and formats nobody asks for cost nothing.

Failures end the job as `failed` with `error.code`:
`invalid_training_file` (data problems, including ones found late, e.g. too few tokens for one
context window), `training_diverged` (NaN/inf loss), `out_of_memory`, `invalid_hyperparameters`
(a configuration the trainer refuses), `internal_error` (anything else; logged with its traceback).
The worker process itself always stays up for the next job.

This module is the orchestration; the pieces live next to it: `worker.process` (per-process
handles, worker ids, the shutdown flag), `worker.lease` (claim, heartbeat), `worker.data_cache`
(files, tokenizers, tokens), `worker.checkpoint_restore` (resume / continue-training checkpoints),
`worker.failures` (error codes) and `worker.callbacks` (metrics, stored checkpoints, stop requests).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from core.jobstates import add_event, transition
from core.models import File, Job
from core.naming import checkpoint_model_id, final_model_id
from core.settings import Settings
from trainer.config import ModelConfig, TrainConfig
from worker.callbacks import (
    LeaseLost,
    ServiceCallbacks,
    delete_metrics_after,
    lock_held_job,
    store_checkpoint,
)
from worker.checkpoint_restore import base_model_checkpoint, latest_checkpoint
from worker.data_cache import fetch_file, job_tokenizer, prepare_tokens, tokenizer_of
from worker.failures import JobFailure, classify_exception
from worker.lease import Heartbeat, claim
from worker.process import Resources, new_worker_id, request_shutdown, resources, shutdown_event

# names other modules and tests import from here (they moved to the modules above)
__all__ = [
    "Heartbeat",
    "JobFailure",
    "Resources",
    "classify_exception",
    "clean_stale_job_dirs",
    "new_worker_id",
    "request_shutdown",
    "resources",
    "run_job",
    "worker_device",
]

log = logging.getLogger(__name__)


def run_job(job_id: str, settings: Settings, *, worker_id: str | None = None) -> str | None:
    """Claim and run one job. Returns the status the job ended in, or None when the message was
    dropped (job not claimable) or the lease was lost. Never raises for a job's own failure."""
    res = resources(settings)
    worker_id = worker_id or new_worker_id()
    if not claim(res.session_factory, job_id, worker_id, settings.lease_seconds):
        return None

    heartbeat = Heartbeat(
        res.session_factory, job_id, worker_id, settings.lease_seconds, settings.heartbeat_seconds
    )
    heartbeat.start()
    jobs_dir = Path(settings.work_dir) / "jobs"
    clean_stale_job_dirs(jobs_dir)
    # per claim, so a worker that lost its lease never shares (or deletes) its successor's files
    job_dir = jobs_dir / f"{job_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    runner = _JobRun(job_id, worker_id, settings, res, heartbeat.lost, job_dir)
    try:
        return runner.run()
    finally:
        heartbeat.stop()
        shutil.rmtree(job_dir, ignore_errors=True)


def clean_stale_job_dirs(jobs_dir: Path) -> None:
    """Remove scratch folders (`<job id>.<pid>.<hex>`) of worker processes that no longer exist
    (a SIGKILLed worker cannot clean up after itself)."""
    if not jobs_dir.is_dir():
        return
    for d in jobs_dir.iterdir():
        parts = d.name.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


class _JobRun:
    """One claimed job from its inputs to its final state (steps 3-6 of the module docstring)."""

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
        self.cache_dir = Path(settings.work_dir) / "cache"

    # ------------------------------------------------------------------ top level
    def run(self) -> str | None:
        try:
            return self._run()
        except LeaseLost:
            log.warning("job %s: lease lost; leaving the job to its new owner", self.job_id)
            return None
        except JobFailure as exc:
            return self._fail(exc.code, exc.message, exc.param)
        except Exception as exc:
            failure = classify_exception(exc)
            if failure.code == "internal_error":
                log.error("job %s failed with an internal error\n%s", self.job_id, traceback.format_exc())
            else:
                log.info("job %s failed: %s: %s", self.job_id, failure.code, failure.message)
            return self._fail(failure.code, failure.message, failure.param)

    def _run(self) -> str | None:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        with self.sf() as session:
            job = self._held(session)
            snapshot = _JobSnapshot.of(job, session)
        early = self._requested_stop()
        if early:
            return early

        train_path = fetch_file(self.sf, self.store, self.cache_dir, snapshot.training_file, "training_file")
        val_path = None
        if snapshot.validation_file:
            val_path = fetch_file(
                self.sf, self.store, self.cache_dir, snapshot.validation_file, "validation_file"
            )

        model_cfg = ModelConfig.from_dict(snapshot.model_config)
        train_cfg = TrainConfig.from_dict({**snapshot.train_config, "seed": snapshot.seed})
        device = worker_device(self.settings.device)
        if train_cfg.device == "auto" and device is not None:
            train_cfg = TrainConfig.from_dict({**train_cfg.to_dict(), "device": device})

        resume_path, resume_step = latest_checkpoint(
            self.sf, self.store, self.job_id, self.job_dir / "resume"
        )
        init_from = None
        if resume_path is None and snapshot.base_model_id:
            init_from = base_model_checkpoint(
                self.sf, self.store, snapshot.base_model_id, snapshot.owner_id, self.job_dir / "parent"
            )

        if resume_path is not None:
            tokenizer = tokenizer_of(resume_path)
        elif init_from is not None:
            tokenizer = tokenizer_of(init_from)
        else:
            tokenizer = job_tokenizer(self.cache_dir, train_path, snapshot.training_sha256, train_cfg)
        data = prepare_tokens(self.cache_dir, train_path, val_path, tokenizer, train_cfg)

        early = self._requested_stop()
        if early:
            return early
        with self.sf() as session:
            job = self._held(session)
            deleted = delete_metrics_after(session, self.job_id, resume_step if resume_path else -1)
            fields: dict[str, Any] = {"step": resume_step if resume_path else 0}
            if resume_path is not None:
                message = f"Resuming from the checkpoint at step {resume_step}"
                if deleted:
                    message += f" ({deleted} metric rows after it will be logged again)"
                log.info("job %s: %s", self.job_id, message)
                add_event(session, self.job_id, message, data={"step": resume_step})
            transition(session, job, "running", **fields)
            session.commit()

        from trainer.loop import train

        callbacks = ServiceCallbacks(
            self.sf,
            self.store,
            job_id=self.job_id,
            worker_id=self.worker_id,
            checkpoint_model_id=lambda step: checkpoint_model_id(snapshot.naming_job, step),
            scratch=self.job_dir,
            flush_seconds=self.settings.metrics_flush_seconds,
            keep_checkpoints=train_cfg.keep_checkpoints,
            lease_lost=self.lease_lost,
            shutdown=shutdown_event,
        )
        out_dir = self.job_dir / "run"
        try:
            result = train(
                model_cfg,
                train_cfg,
                data,
                out_dir,
                callbacks,
                tokenizer=tokenizer,
                resume=resume_path or False,
                init_from=init_from,
            )
        finally:
            callbacks.flush()
        if callbacks.cause == "lease_lost" or self.lease_lost.is_set():
            raise LeaseLost(self.job_id)

        if result.stop_reason in ("completed", "time_limit"):
            final = result.final_checkpoint
            if final is None:
                raise JobFailure("internal_error", "Training ended without a final checkpoint.")
            return self._succeed(snapshot, final, result.step, result.tokens_seen, callbacks)
        if callbacks.cause == "cancel":
            return self._finish("cancelled")
        if callbacks.cause == "pause":
            return self._finish("paused", message=f"Paused at step {result.step}")
        if callbacks.cause == "shutdown":
            return self._requeue_for_shutdown(snapshot.queue, result.step)
        raise JobFailure("internal_error", f"Training stopped unexpectedly ({result.stop_reason}).")

    # ------------------------------------------------------------------ pieces
    def _held(self, session: Session) -> Job:
        if self.lease_lost.is_set():
            raise LeaseLost(self.job_id)
        return lock_held_job(session, self.job_id, self.worker_id)

    def _requested_stop(self) -> str | None:
        """Honour cancel/pause/shutdown that arrived before training started."""
        with self.sf() as session:
            job = self._held(session)
            cancel, pause = job.cancel_requested, job.pause_requested
        if cancel:
            return self._finish("cancelled")
        if pause:
            return self._finish("paused", message="Paused before training started")
        if shutdown_event.is_set():
            with self.sf() as session:
                return self._requeue_for_shutdown(self._held(session).queue, None)
        return None

    # ------------------------------------------------------------------ endings
    def _succeed(
        self, snapshot: _JobSnapshot, final: Path, step: int, tokens: int, callbacks: ServiceCallbacks
    ) -> str:
        model_id = final_model_id(snapshot.naming_job)

        def finish(session: Session, job: Job) -> None:
            transition(session, job, "succeeded", fine_tuned_model=model_id, step=step, trained_tokens=tokens)

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
            keep=snapshot.keep_checkpoints,
            scratch=self.job_dir,
            extra=finish,
        )
        log.info("job %s succeeded: %s", self.job_id, model_id)
        return "succeeded"

    def _finish(self, status: str, message: str | None = None) -> str:
        with self.sf() as session:
            job = self._held(session)
            transition(session, job, status)
            session.commit()
        log.info("job %s %s%s", self.job_id, status, f": {message}" if message else "")
        return status

    def _requeue_for_shutdown(self, queue: str, step: int | None) -> str:
        with self.sf() as session:
            job = self._held(session)
            transition(session, job, "queued")
            session.commit()
        log.info(
            "worker shutting down: job %s re-queued%s",
            self.job_id,
            f" from step {step}" if step is not None else "",
        )
        try:
            from worker.celery_app import enqueue_job

            enqueue_job(self.job_id, queue)
        except Exception:  # the reaper re-sends messages for queued jobs nobody holds
            log.warning("could not re-send job %s; the reaper will", self.job_id, exc_info=True)
        return "queued"

    def _fail(self, code: str, message: str, param: str | None = None) -> str | None:
        try:
            with self.sf() as session:
                job = self._held(session)
                transition(session, job, "failed", error_code=code, error_message=message, error_param=param)
                session.commit()
        except LeaseLost:
            log.warning("job %s: lease lost before its failure (%s) could be recorded", self.job_id, code)
            return None
        return "failed"


@dataclass
class _JobSnapshot:
    """The job's inputs, read once (plain values, safe after the session closed)."""

    owner_id: str
    training_file: str
    training_sha256: str
    validation_file: str | None
    model_config: dict[str, Any]
    train_config: dict[str, Any]
    seed: int
    base_model_id: str | None
    queue: str
    keep_checkpoints: int | None
    naming_job: Any  # a detached Job for core.naming

    @classmethod
    def of(cls, job: Job, session: Session) -> _JobSnapshot:
        file = session.get(File, job.training_file)
        sha = file.sha256 if file is not None else ""
        session.expunge(job)
        return cls(
            owner_id=job.owner_id,
            training_file=job.training_file,
            training_sha256=sha,
            validation_file=job.validation_file,
            model_config=dict(job.model_config or {}),
            train_config=dict(job.train_config or {}),
            seed=int(job.seed),
            base_model_id=job.base_model_id,
            queue=job.queue,
            keep_checkpoints=(job.train_config or {}).get("keep_checkpoints", 3),
            naming_job=job,
        )


def worker_device(setting: str) -> str | None:
    """The TrainConfig.device a worker's `device` setting means for jobs that left it "auto"
    (None: let the trainer choose). `cuda:N` pins this worker process to GPU N."""
    if setting in ("cpu", "cuda"):
        return setting
    if setting.startswith("cuda:"):
        import torch

        torch.cuda.set_device(int(setting.split(":", 1)[1]))
        return "cuda"
    return None  # "auto", or a device the trainer does not know (it picks cuda when available)
