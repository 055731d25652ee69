"""`CheckpointUploads`: a job's step checkpoints stored in the blob store on a background thread,
so training goes on while they upload.

A checkpoint the trainer reports is first staged: hard-linked (no bytes copied) into the job's
scratch folder, where the trainer's own rotation cannot delete it mid-upload. Then its upload
(worker.checkpoint_store.store_checkpoint, with the lease check and the Checkpoint row) runs in
the background, one at a time (trainer.run.one_at_a_time): the next checkpoint waits for the one
before, so at most one is in flight. An upload that meets an outage (the database, or the S3
server) retries for `retry_seconds`; past that, `DatabaseUnavailable` is raised on the training
thread at the next hand-over or at `wait()`, and the attempt is given up: the job resumes from
the checkpoint stored before. A job's end (`wait()`: the final checkpoint, a pause, a shutdown)
waits for the upload in flight.

A cancel does not wait for storage to come back: a cancelled job needs no checkpoint. While an
upload retries through an outage, a wait for it (the next checkpoint's hand-over, or the job's end)
asks `cancelled()` every CHECK_SECONDS; once that says yes the upload is abandoned: the wait
returns False at once, the retry loop stops before its next try (worker.db_retry.RetryStopped,
dropped with the thread) and nothing more is uploaded. A try already in progress ends on its own
(botocore's timeouts); should it still succeed, the checkpoint's row is written only while this
worker holds the job, else its blobs are deleted (worker.checkpoint_store). A pause or a shutdown
is no cancel: it waits, as its resume needs its checkpoint stored.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.blobstore import is_store_outage
from core.db_faults import is_connection_error
from trainer.checkpoint import copy_checkpoint
from trainer.run.checkpoint_writer import BACKGROUND_NICE
from trainer.run.one_at_a_time import OneAtATime
from worker.db_retry import DbRetry

if TYPE_CHECKING:
    from trainer.run.checkpoint_writer import CheckpointTimes

log = logging.getLogger(__name__)

StoreFolder = Callable[[int, Path, DbRetry], None]  # (step, staged folder, its retry) -> stored
CHECK_SECONDS = 0.25  # how often a wait for an upload that retries through an outage asks for a cancel


class CheckpointUploads:
    def __init__(
        self, staging: Path, retry_seconds: float, cancelled: Callable[[], bool] | None = None
    ) -> None:
        """`cancelled()`: whether the job no longer needs its checkpoints (cancelled, or no longer
        this worker's); asked on the caller's thread, only while an upload retries."""
        self.staging = staging
        self.cancelled = cancelled or (lambda: False)
        self.abandoned = threading.Event()  # set once: the upload in flight is given up, none follow
        self.retry = DbRetry(
            "checkpoint uploads",
            retry_seconds,
            retryable=is_store_outage,
            what=_what_was_away,
            stop=self.abandoned,
        )
        self._background = OneAtATime("checkpoint-upload", nice=BACKGROUND_NICE)
        self._finished = threading.Event()  # the upload in flight (if any) has ended
        self._finished.set()
        self.count = 0

    def submit(self, folders: list[tuple[int, Path]], store: StoreFolder) -> bool:
        """Stage the (step, folder) checkpoints now and store them in the background, in order,
        once the upload in flight is done (its error raises here). False, with nothing staged, when
        the uploads were abandoned (see `wait`)."""
        if not self.wait():
            return False
        staged = [(step, self._stage(step, folder)) for step, folder in folders]

        def upload() -> None:
            try:
                for step, folder in staged:
                    store(step, folder, self.retry)
            finally:
                for _, folder in staged:
                    shutil.rmtree(folder, ignore_errors=True)
                self._finished.set()

        self.count += len(staged)
        self._finished.clear()
        self._background.start(upload)
        return True

    def _stage(self, step: int, folder: Path) -> Path:
        # the folder's name is its name in the tar (step-XXXXXXXX or best)
        return copy_checkpoint(folder, self.staging / f"{step:08d}" / folder.name)

    def wait(self) -> bool:
        """Until the upload in flight is stored (its error raises here): True. False when the job
        was cancelled while the upload retried through an outage: it is abandoned, not waited for."""
        if self.abandoned.is_set():
            return False
        while not self._finished.wait(CHECK_SECONDS):
            if self.retry.outage.down and self.cancelled():
                self._abandon()
                return False
        self._background.wait()
        return True

    def _abandon(self) -> None:
        log.warning(
            "checkpoint upload from %s abandoned while the %s was unreachable: the job no longer needs it "
            "(cancelled, or no longer this worker's)",
            self.staging,
            self.retry.outage.what,
        )
        self.abandoned.set()  # the retry loop stops before its next try; its thread is not waited for

    def close(self) -> None:
        """When the attempt is failing anyway: let the upload in flight finish (unless abandoned),
        drop its error."""
        if not self.abandoned.is_set():
            self._background.close()

    @property
    def seconds(self) -> float:
        """Seconds spent uploading in the background."""
        return self._background.busy_seconds


def _what_was_away(error: BaseException) -> str:
    return "the database" if is_connection_error(error) else "the blob store"


def checkpoint_costs_event(
    trained: CheckpointTimes, uploads: int, upload_seconds: float
) -> tuple[str, dict[str, Any]]:
    """The job's event about its background checkpoints: written, uploaded, and what training waited."""
    data = {
        "checkpoints": trained.count,
        "step_checkpoints": trained.resumable,
        "best_snapshots": trained.weights_only,
        "at_end": trained.at_end,
        "tensor_bytes": trained.bytes,
        "write_seconds": round(trained.write, 3),
        "uploads": uploads,
        "upload_seconds": round(upload_seconds, 3),
        "stall_seconds": round(trained.stall, 3),
        "snapshot_seconds": round(trained.snapshot, 3),
        "waited_seconds": round(trained.waited, 3),
        "reported_seconds": round(trained.reported, 3),
    }
    # the uploads count those of the step checkpoints written as training ended too
    at_end = trained.at_end_note()
    stored = (
        f"{uploads} uploaded in {upload_seconds:.1f} s"
        if uploads
        else "none uploaded (the model is stored at the end)"
    )
    return (
        f"Checkpoints in the background: {trained.count} written ({trained.kinds()}) in "
        f"{trained.write:.1f} s{at_end}; {stored}; training waited {trained.stall:.2f} s for the "
        "background ones",
        data,
    )
