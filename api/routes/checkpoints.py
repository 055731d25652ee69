"""GET /v1/fine_tuning/jobs/{id}/checkpoints: OpenAI's checkpoint objects, newest step first,
`after` (a checkpoint id) / `limit` (default 10). `fine_tuned_model_checkpoint` is the model id
that /v1/models, /content and /generate accept. Deleted checkpoint models are not listed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import and_, or_, select

from api.deps import CurrentKey, SessionDep
from api.queries import AfterId, bad_cursor, owned_job
from api.schemas import CheckpointObject, ListEnvelope, to_checkpoint
from core.models import Checkpoint, DeletedModel

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])


@router.get(
    "/jobs/{job_id}/checkpoints",
    response_model=ListEnvelope[CheckpointObject],
    summary="A job's checkpoints, newest first",
)
def list_checkpoints(
    job_id: str,
    session: SessionDep,
    key: CurrentKey,
    after: AfterId = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 10,
) -> ListEnvelope[CheckpointObject]:
    job = owned_job(session, key.owner_id, job_id)
    deleted = select(DeletedModel.model_id).where(DeletedModel.owner_id == key.owner_id)
    q = select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.model_id.not_in(deleted))
    if after:
        cursor = session.scalar(select(Checkpoint).where(Checkpoint.id == after, Checkpoint.job_id == job.id))
        if cursor is None:
            raise bad_cursor(after)
        q = q.where(
            or_(
                Checkpoint.step < cursor.step, and_(Checkpoint.step == cursor.step, Checkpoint.id < cursor.id)
            )
        )
    rows = session.scalars(q.order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(limit + 1)).all()
    data = [to_checkpoint(c) for c in rows[:limit]]
    return ListEnvelope.of(data, has_more=len(rows) > limit)
