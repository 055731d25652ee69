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
"""

from __future__ import annotations

import shutil
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

StoreFolder = Callable[[int, Path, DbRetry], None]  # (step, staged folder, its retry) -> stored


class CheckpointUploads:
    def __init__(self, staging: Path, retry_seconds: float) -> None:
        self.staging = staging
        self.retry = DbRetry(
            "checkpoint uploads", retry_seconds, retryable=is_store_outage, what=_what_was_away
        )
        self._background = OneAtATime("checkpoint-upload", nice=BACKGROUND_NICE)
        self.count = 0

    def submit(self, folders: list[tuple[int, Path]], store: StoreFolder) -> None:
        """Stage the (step, folder) checkpoints now and store them in the background, in order,
        once the upload in flight is done (its error raises here)."""
        self._background.wait()
        staged = [(step, self._stage(step, folder)) for step, folder in folders]

        def upload() -> None:
            try:
                for step, folder in staged:
                    store(step, folder, self.retry)
            finally:
                for _, folder in staged:
                    shutil.rmtree(folder, ignore_errors=True)

        self.count += len(staged)
        self._background.start(upload)

    def _stage(self, step: int, folder: Path) -> Path:
        # the folder's name is its name in the tar (step-XXXXXXXX or best)
        return copy_checkpoint(folder, self.staging / f"{step:08d}" / folder.name)

    def wait(self) -> None:
        """Until the upload in flight is stored (its error raises here)."""
        self._background.wait()

    def close(self) -> None:
        """When the attempt is failing anyway: let the upload in flight finish, drop its error."""
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
