"""Run one training job inside a worker process: `run_job(job_id, settings)`.

The Celery message carries only the job id; everything else is read from the database here, so a
replayed or duplicated message is harmless:

1. **Claim.** The worker starts the fairest job waiting on the message's queue, not always the one
   the message names (worker/fair_pick.py: one key's backlog does not hold back another key's job).
   `core.jobstates.claim_job` is an atomic conditional UPDATE that only succeeds for a
   job in `queued` (or `validating_files`: rows from before jobs were created queued) that nobody
   holds. `None` means the job is running elsewhere, finished, paused or cancelled: the message is
   logged and dropped. A job whose owner already
   has `max_running_jobs_per_key` jobs running is deferred (worker/running_quota.py): it waits
   `queued`, and is sent again when one of them ends (`resend_deferred`, after every job).
2. **Lease.** A heartbeat thread renews the lease every `heartbeat_seconds`. If a renewal finds the
   lease gone (the reaper gave the job away after this worker stalled), training stops at the next
   step and this worker writes nothing more for the job.
3. **Files.** The training/validation files are downloaded from the blob store into
   `work_dir/cache/files/<sha256>` (once per content) and validated while the job is
   `validating_files` (the worker moves it there from `queued`: a job waiting for a worker is
   `queued`, as in OpenAI's API). The tokenizer is cached per (file sha256, tokenizer kind,
   vocab_size) under `work_dir/cache/tokenizers/`, the tokenized data per (file sha256, tokenizer hash) under
   `work_dir/cache/tokens/` (see `trainer.data.prepare.prepare_data`).
4. **Start or resume.** The newest stored Checkpoint of the job (a tar in the blob store) is
   extracted and training resumes from it; metric rows after its step are deleted first so the
   series never has duplicate steps. A job with `base_model_id` ("continue training" a model this
   owner trained before) starts from that model's final checkpoint (`init_from`: weights, tokenizer
   and architecture, fresh optimizer).
5. **Train** with `worker.callbacks.ServiceCallbacks` (metrics in batches, checkpoints to the blob
   store, cancel/pause between steps).
6. **Finish.** Completed (or at the time limit, or stopped early): the model's checkpoint (final/:
   the best evaluation's when the run ended past it) is stored as a Checkpoint row with `is_final`, the
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

This module claims the job and holds its lease; `worker.job_run.JobRun` takes it through steps
3-6. The pieces live next to them: `worker.process` (per-process handles, worker ids, the shutdown
flag), `worker.lease` (claim, heartbeat, the lease check of every state change),
`worker.job_inputs` (the job's inputs, configs and device), `worker.data_cache` (files, tokenizers,
tokens), `worker.checkpoint_restore` / `worker.checkpoint_store` (checkpoints from / into the blob
store), `worker.metric_rows` (metric upserts), `worker.callbacks` (the trainer's callbacks: metrics,
checkpoints, stop requests) and `worker.failures` (error codes).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from core.settings import Settings
from core.status import JobStatus
from worker.job_run import JobRun
from worker.lease import Heartbeat, claim, hand_back_message
from worker.process import new_worker_id, resources, shutdown_event
from worker.running_quota import resend_deferred


def run_job(job_id: str, settings: Settings, *, worker_id: str | None = None) -> JobStatus | None:
    """Claim and run one job. Returns the status the job ended in, or None when the message was
    dropped (job not claimable) or the lease was lost. Never raises for a job's own failure."""
    res = resources(settings)
    if shutdown_event.is_set():  # the message came after this worker's SIGTERM: leave it to another
        hand_back_message(res.session_factory, job_id)
        return None
    worker_id = worker_id or new_worker_id()
    max_running = settings.max_running_jobs_per_key
    claimed = claim(res.session_factory, job_id, worker_id, settings.lease_seconds, max_running)
    if claimed is None:
        return None
    job_id = claimed  # the fairest job waiting, maybe not the message's (worker/fair_pick.py)

    heartbeat = Heartbeat(
        res.session_factory, job_id, worker_id, settings.lease_seconds, settings.heartbeat_seconds
    )
    heartbeat.start()
    jobs_dir = settings.work_path / "jobs"
    clean_stale_job_dirs(jobs_dir)
    # per claim, so a worker that lost its lease never shares (or deletes) its successor's files
    job_dir = jobs_dir / f"{job_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    runner = JobRun(job_id, worker_id, settings, res, heartbeat.lost, job_dir)
    try:
        return runner.run()
    finally:
        heartbeat.stop()
        shutil.rmtree(job_dir, ignore_errors=True)
        resend_deferred(res.session_factory, job_id, max_running)  # a running slot of the owner is free


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
