"""Owner-scoped lookups shared by the routers. Every query filters by `owner_id`: another owner's
id reads exactly like an id that does not exist (404), so ids leak nothing.

Models
------
A model id is either a finished job's `fine_tuned_model` (`ft:<preset>[:<suffix>]:<job hex>`) or a
checkpoint's `model_id` (`<final id>:ckpt-step-<N>`). `find_model` resolves both to the job and
the checkpoint whose weights they are (for a final model: the job's final checkpoint, else its
newest). Models listed in `deleted_models` are gone for every route.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import Query
from sqlalchemy import ColumnElement, Select, and_, or_, select
from sqlalchemy.orm import Session

from api.errors import APIError, not_found
from core.models import Checkpoint, DeletedModel, File, Job
from core.status import JobStatus
from trainer.config import PRESETS


def live_files(owner_id: str) -> Select[File]:
    """The owner's files that have not been deleted."""
    return select(File).where(File.owner_id == owner_id, File.deleted_at.is_(None))


def owned_file(session: Session, owner_id: str, file_id: str) -> File:
    f = session.scalar(live_files(owner_id).where(File.id == file_id))
    if f is None:
        raise not_found("file", file_id)
    return f


def owned_job(session: Session, owner_id: str, job_id: str) -> Job:
    job = session.scalar(select(Job).where(Job.id == job_id, Job.owner_id == owner_id))
    if job is None:
        raise not_found("fine-tuning job", job_id)
    return job


@dataclass
class ModelRef:
    id: str
    kind: str  # "fine_tuned" | "checkpoint"
    job: Job
    checkpoint: Checkpoint | None  # the weights (None: a finished job whose checkpoint is missing)
    created_at: datetime


def is_deleted(session: Session, owner_id: str, model_id: str) -> bool:
    return (
        session.scalar(
            select(DeletedModel.model_id).where(
                DeletedModel.model_id == model_id, DeletedModel.owner_id == owner_id
            )
        )
        is not None
    )


def final_checkpoint(session: Session, job: Job) -> Checkpoint | None:
    return session.scalar(
        select(Checkpoint)
        .where(Checkpoint.job_id == job.id)
        .order_by(Checkpoint.is_final.desc(), Checkpoint.step.desc())
        .limit(1)
    )


def find_model(session: Session, owner_id: str, model_id: str) -> ModelRef | None:
    if is_deleted(session, owner_id, model_id):
        return None
    job = session.scalar(
        select(Job).where(
            Job.fine_tuned_model == model_id, Job.owner_id == owner_id, Job.status == JobStatus.SUCCEEDED
        )
    )
    if job is not None:
        ckpt = session.scalar(select(Checkpoint).where(Checkpoint.model_id == model_id)) or final_checkpoint(
            session, job
        )
        return ModelRef(model_id, "fine_tuned", job, ckpt, job.finished_at or job.created_at)
    ckpt = session.scalar(
        select(Checkpoint).where(Checkpoint.model_id == model_id, Checkpoint.owner_id == owner_id)
    )
    if ckpt is None:
        return None
    job = session.get(Job, ckpt.job_id)
    if job is None:
        return None
    return ModelRef(model_id, "checkpoint", job, ckpt, ckpt.created_at)


def owned_model(session: Session, owner_id: str, model_id: str) -> ModelRef:
    """A trained model of the owner's; a base model (a preset, listed by GET /v1/models) is a 400:
    it names an architecture, with no weights to download, sample or delete."""
    ref = find_model(session, owner_id, model_id)
    if ref is None:
        if model_id in PRESETS:
            raise APIError(
                400,
                f"{model_id} is a base model: an architecture with no trained weights. Train it "
                "(POST /v1/fine_tuning/jobs with this model) and use the model the job makes",
                param="model",
                code="base_model",
            )
        raise not_found("model", model_id, param="model")
    return ref


# ------------------------------------------------------------------------------------- pagination
AfterId = Annotated[
    str | None, Query(max_length=256, description="the id of the last item of the previous page")
]


def newest_first_after(model: type[File] | type[Job], cursor_row: File | Job) -> ColumnElement[bool]:
    """Keyset condition for (created_at DESC, id DESC) pages that start after `cursor_row`."""
    return or_(
        model.created_at < cursor_row.created_at,
        and_(model.created_at == cursor_row.created_at, model.id < cursor_row.id),
    )


def bad_cursor(after: str) -> APIError:
    return APIError(400, f"after={after!r} is not an id from this list", param="after", code="invalid_cursor")


# Metric steps and Event seqs are 32-bit INTEGER columns in PostgreSQL, which refuses to compare one
# with a larger bound; a cursor past their range is past every row, and one before it before all.
COLUMN_MIN, COLUMN_MAX = -1, 2**31 - 1


def in_column_range(n: int) -> int:
    return max(COLUMN_MIN, min(n, COLUMN_MAX))
