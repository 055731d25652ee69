"""Store a job's checkpoint folders in the blob store (`store_checkpoint`), as uncompressed tars
with a Checkpoint row each; the newest step checkpoint's optimizer state, which only a resume needs,
is a second blob that the next checkpoint drops. Bringing them back is worker.checkpoint_restore.

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
from core.models import Blob, Checkpoint, Export, Job, utcnow
from trainer.checkpoint_snapshot import OPTIMIZER_FILE
from worker.checkpoint_files import tar_stream
from worker.checkpoint_quota import prune_over_quota
from worker.lease import LeaseLost, lock_held_job

if TYPE_CHECKING:
    from core.blobstore import BlobStore
    from worker.db_retry import DbRetry

log = logging.getLogger(__name__)
WEIGHTS_ONLY = frozenset({OPTIMIZER_FILE})  # what the tar leaves out: the optimizer is a blob of its own


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
    extra: Callable[[Session, Job], None] | None = None,
    max_stored_bytes: int | None = None,
    retry: DbRetry | None = None,
    protect_step: int | None = None,
) -> str:
    """Tar `folder` without its optimizer state into the blob store, and that state as a second blob
    when it is the job's newest step checkpoint (never a final one: the job is over); then record the
    Checkpoint row (an earlier row for the step is replaced) in one transaction that first checks
    the lease, and runs `extra(session, job)` (the runner finishes the job there). `retry`: the whole
    is retried through an outage (worker.db_retry). Rotation and the quota never drop the checkpoint
    of `protect_step` (the run's best so far). Returns the checkpoint id."""
    optimizer_file = folder / OPTIMIZER_FILE
    with_optimizer = not is_final and optimizer_file.exists()

    def upload_and_record() -> tuple[str, list[str]]:
        with session_factory() as session:
            # Upload first, then lock the job row only for the short bookkeeping transaction (a long
            # upload must not block heartbeats or the API's cancel request behind a row lock).
            weights = tar_stream(folder, folder.name, WEIGHTS_ONLY)  # a tar made as it uploads
            blobs = store.put_many([weights, optimizer_file] if with_optimizer else [weights], session)
            try:
                job = lock_held_job(session, job_id, worker_id)
            except LeaseLost:
                session.rollback()
                for blob in blobs:
                    _delete_blob(session_factory, store, blob.id)
                raise
            ckpt, doomed = _record_row(session, job, step, model_id, blobs, metrics, is_final)
            if keep:
                doomed += _rotate(session, job_id, keep, protect_step)
            if max_stored_bytes is not None:
                doomed += prune_over_quota(session, job_id, job.owner_id, max_stored_bytes, protect_step)
            if extra is not None:
                extra(session, job)
            session.commit()
            return ckpt.id, doomed

    # a dropped connection or an outage: the whole upload again (fresh blobs; the half-written
    # ones stay incomplete, never readable, and the reaper's blob gc removes them)
    ckpt_id, doomed = retry.call(upload_and_record) if retry is not None else upload_and_record()
    for blob_id in doomed:
        _delete_blob(session_factory, store, blob_id)
    return ckpt_id


def _record_row(
    session: Session,
    job: Job,
    step: int,
    model_id: str,
    blobs: list[Blob],
    metrics: dict[str, Any],
    is_final: bool,
) -> tuple[Checkpoint, list[str]]:
    """The step's row pointing at the weights tar and (when this is the job's newest step checkpoint)
    the optimizer blob; every other row of the job loses its optimizer blob. Returns the row and the
    blobs to delete once the transaction committed."""
    doomed: list[str] = []
    optimizer_blob = blobs[1].id if len(blobs) > 1 else None
    if optimizer_blob is not None and _newer_stored(session, job.id, step):
        doomed.append(optimizer_blob)  # a resume starts from the newer one
        optimizer_blob = None
    ckpt, replaced = _point_row_at(
        session, job, step, model_id, blobs[0].id, optimizer_blob, metrics, is_final
    )
    session.flush()
    doomed += replaced
    if optimizer_blob is not None or is_final:
        doomed += _drop_optimizer_state(session, job.id, but=ckpt.id)
    return ckpt, doomed


def _newer_stored(session: Session, job_id: str, step: int) -> bool:
    newer = select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step > step).limit(1)
    return session.scalar(newer) is not None


def _drop_optimizer_state(session: Session, job_id: str, but: str) -> list[str]:
    """Every other checkpoint of the job becomes weights-only (only the newest is resumed from).
    Returns the optimizer blobs to delete once the transaction committed."""
    rows = session.scalars(
        select(Checkpoint).where(
            Checkpoint.job_id == job_id, Checkpoint.id != but, Checkpoint.optimizer_blob_id.is_not(None)
        )
    ).all()
    doomed = [str(row.optimizer_blob_id) for row in rows]
    for row in rows:
        row.optimizer_blob_id = None
    return doomed


def _point_row_at(
    session: Session,
    job: Job,
    step: int,
    model_id: str,
    blob_id: str,
    optimizer_blob_id: str | None,
    metrics: dict[str, Any],
    is_final: bool,
) -> tuple[Checkpoint, list[str]]:
    """The step's Checkpoint row, now holding `blob_id` and `optimizer_blob_id` (a row stored
    earlier for the step is updated), and the blobs the earlier row held, to delete after the commit.
    A weights-only copy of a step stored with its optimizer state (the run's best snapshot, taken
    at a step checkpoint's step: the same weights) keeps that state, which a resume needs; a final
    checkpoint keeps none."""
    old = session.execute(
        select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == step)
    ).scalar_one_or_none()
    if old is not None:
        if optimizer_blob_id is None and not is_final:
            optimizer_blob_id = old.optimizer_blob_id
        replaced = [
            b for b in (old.blob_id, old.optimizer_blob_id) if b is not None and b != optimizer_blob_id
        ]
        old.blob_id, old.optimizer_blob_id = blob_id, optimizer_blob_id
        old.metrics, old.is_final, old.created_at = metrics, is_final or old.is_final, utcnow()
        return old, replaced
    ckpt = Checkpoint(
        job_id=job.id,
        owner_id=job.owner_id,
        step=step,
        model_id=model_id,
        blob_id=blob_id,
        optimizer_blob_id=optimizer_blob_id,
        metrics=metrics,
        is_final=is_final,
    )
    session.add(ckpt)
    return ckpt, []


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
        doomed += [b for b in (ckpt.blob_id, ckpt.optimizer_blob_id) if b is not None]
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
