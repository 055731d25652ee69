"""Store a job's checkpoint folders in the blob store (`store_checkpoint`), as uncompressed tars
with a Checkpoint row each. Bringing them back is worker.checkpoint_restore.

Stored checkpoints are rotated like the trainer's local ones: the newest `keep` step checkpoints of
a job are kept (plus the final one, and the run's best evaluation's, `protect_step`); older rows and their blobs are deleted unless a download (an
Export row) was made from them. When the owner then stores more than `max_stored_bytes`, older
step checkpoints go too (worker/checkpoint_quota.py): the job goes on inside the quota. Every write
first checks that this worker still holds the lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db_faults import describe, is_connection_error
from core.models import Checkpoint, Export, Job, utcnow
from worker.checkpoint_files import tar_folder
from worker.checkpoint_quota import prune_over_quota
from worker.lease import LeaseLost, lock_held_job

if TYPE_CHECKING:
    from core.blobstore import BlobStore
    from worker.db_retry import DbRetry

log = logging.getLogger(__name__)


def store_checkpoint(
    session_factory: sessionmaker[Session],
    store: BlobStore,
    *,
    job_id: str,
    worker_id: str,
    step: int,
    folder: Path,
    model_id: str,
    metrics: dict[str, Any],
    is_final: bool,
    keep: int | None,
    scratch: Path,
    extra: Callable[[Session, Job], None] | None = None,
    max_stored_bytes: int | None = None,
    retry: DbRetry | None = None,
    protect_step: int | None = None,
) -> str:
    """Tar `folder`, put it into the blob store and record the Checkpoint row (replacing an earlier
    row for the same step), all in one transaction that first checks the lease. `extra(session, job)`
    runs in that transaction too (the runner finishes the job there). With `retry`, the upload and
    that transaction are retried through a database outage (worker.db_retry). Rotation and the quota
    never drop the checkpoint of `protect_step` (the run's best so far). Returns the checkpoint id."""
    tar_path = tar_folder(folder, scratch / f"{folder.name}-{step}.tar", arcname=folder.name)

    def upload_and_record() -> tuple[str, list[str]]:
        with session_factory() as session:
            # Upload first, then lock the job row only for the short bookkeeping transaction (a long
            # upload must not block heartbeats or the API's cancel request behind a row lock).
            with open(tar_path, "rb") as fh:
                blob = store.put(fh, session)
            try:
                job = lock_held_job(session, job_id, worker_id)
            except LeaseLost:
                session.rollback()
                _delete_blob(session_factory, store, blob.id)
                raise
            ckpt, old_blob = _point_row_at(session, job, step, model_id, blob.id, metrics, is_final)
            session.flush()
            doomed = [old_blob] if old_blob else []
            if keep:
                doomed += _rotate(session, job_id, keep, protect_step)
            if max_stored_bytes is not None:
                doomed += prune_over_quota(session, job_id, job.owner_id, max_stored_bytes, protect_step)
            if extra is not None:
                extra(session, job)
            session.commit()
            return ckpt.id, doomed

    try:
        # a dropped connection or an outage: the whole upload again (a fresh blob; the half-written
        # one stays incomplete, never readable, and the reaper's blob gc removes it)
        ckpt_id, doomed = retry.call(upload_and_record) if retry is not None else upload_and_record()
        for blob_id in doomed:
            _delete_blob(session_factory, store, blob_id)
        return ckpt_id
    finally:
        tar_path.unlink(missing_ok=True)


def _point_row_at(
    session: Session,
    job: Job,
    step: int,
    model_id: str,
    blob_id: str,
    metrics: dict[str, Any],
    is_final: bool,
) -> tuple[Checkpoint, str | None]:
    """The step's Checkpoint row, now holding `blob_id` (a row stored earlier for the step is
    updated), and the blob the earlier row held, to delete after the commit."""
    old = session.execute(
        select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == step)
    ).scalar_one_or_none()
    if old is not None:
        old_blob, old.blob_id = old.blob_id, blob_id
        old.metrics, old.is_final, old.created_at = metrics, is_final or old.is_final, utcnow()
        return old, old_blob
    ckpt = Checkpoint(
        job_id=job.id,
        owner_id=job.owner_id,
        step=step,
        model_id=model_id,
        blob_id=blob_id,
        metrics=metrics,
        is_final=is_final,
    )
    session.add(ckpt)
    return ckpt, None


def _rotate(session: Session, job_id: str, keep: int, protect_step: int | None) -> list[str]:
    """Delete all but the newest `keep` non-final checkpoint rows of the job (never one a download
    was exported from, nor that of `protect_step`). Returns the blob ids to delete once the
    transaction committed."""
    rows = (
        session.execute(
            select(Checkpoint)
            .where(Checkpoint.job_id == job_id, Checkpoint.is_final.is_(False))
            .order_by(Checkpoint.step.desc())
        )
        .scalars()
        .all()
    )
    exported = (
        set(
            session.execute(
                select(Export.model_id).where(Export.model_id.in_([c.model_id for c in rows]))
            ).scalars()
        )
        if rows
        else set()
    )
    doomed = []
    for ckpt in rows[keep:]:
        if ckpt.model_id in exported or ckpt.step == protect_step:
            continue
        doomed.append(ckpt.blob_id)
        session.delete(ckpt)
    return doomed


def _delete_blob(session_factory: sessionmaker[Session], store: BlobStore, blob_id: str) -> None:
    try:
        with session_factory() as session:
            store.delete(blob_id, session)
            session.commit()
    except Exception as error:  # the reaper's blob gc gets another chance; never fail training over this
        if is_connection_error(error):  # an outage: one line, not a traceback per blob
            log.warning("could not delete blob %s (%s)", blob_id, describe(error))
        else:
            log.warning("could not delete blob %s", blob_id, exc_info=True)
