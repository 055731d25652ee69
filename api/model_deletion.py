"""DELETE /v1/models/{id}: hide a model for good and free what it stores.

A job's model and its final checkpoint are the same weights under two ids: deleting the model
deletes both (deleting the final checkpoint alone leaves the model). Exports go at once (in any
status: a worker still making one finds its row gone and drops the file). Once the job has ended,
the checkpoints of deleted models go too, rows and blobs; while it is running or paused, its
checkpoints are what a resume continues from, so their bytes stay (hidden) until the job's own
rotation frees them or a deletion after it ends. A model that a job not yet ended continues from is refused,
naming the job: that job's worker still has to read its weights.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import APIError
from api.exports import delete_exports
from api.queries import ModelRef, is_deleted
from core.blobstore import BlobStore
from core.models import Checkpoint, DeletedModel, Job
from core.status import TERMINAL


def delete_model(session: Session, store: BlobStore, owner_id: str, ref: ModelRef) -> None:
    """Delete `ref` (and, for a job's model, its final checkpoint) in the session; no commit."""
    ids = {ref.id}
    if ref.kind == "fine_tuned" and ref.checkpoint is not None:
        ids.add(ref.checkpoint.model_id)
    _refuse_if_continued(session, owner_id, ref.id, ids)
    for model_id in sorted(ids):
        if not is_deleted(session, owner_id, model_id):
            session.add(DeletedModel(model_id=model_id, owner_id=owner_id))
        delete_exports(session, store, model_id)
    session.flush()
    if ref.job.status in TERMINAL:
        _delete_checkpoints(session, store, owner_id, ref.job)


def _refuse_if_continued(session: Session, owner_id: str, model_id: str, ids: set[str]) -> None:
    users = session.scalars(
        select(Job.id).where(
            Job.owner_id == owner_id, Job.base_model_id.in_(ids), Job.status.not_in(list(TERMINAL))
        )
    ).all()
    if users:
        raise APIError(
            400,
            f"Model {model_id} is the starting point of job(s) that have not finished: "
            f"{', '.join(sorted(users))}. Cancel them or wait until they finish, then delete the model.",
            param="model",
            code="model_in_use",
        )


def _delete_checkpoints(session: Session, store: BlobStore, owner_id: str, job: Job) -> None:
    """Delete the ended job's checkpoint rows whose models are deleted, with their blobs; the final
    one only once the job's model (the same weights) is deleted too."""
    rows = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id)).all()
    names = [row.model_id for row in rows] + [job.fine_tuned_model or ""]
    deleted = set(
        session.scalars(
            select(DeletedModel.model_id).where(
                DeletedModel.owner_id == owner_id, DeletedModel.model_id.in_(names)
            )
        )
    )  # one query for the job's models, not one per checkpoint
    model_kept = job.fine_tuned_model is not None and job.fine_tuned_model not in deleted
    for row in rows:
        if row.model_id not in deleted or (row.is_final and model_kept):
            continue
        blobs = [b for b in (row.blob_id, row.optimizer_blob_id) if b is not None]
        session.delete(row)
        session.flush()  # the row goes before the blobs it points at
        for blob_id in blobs:
            store.delete(blob_id, session)
