"""/v1/fine_tuning/jobs: create, list, retrieve, cancel, pause, resume; and /v1/fine_tuning/presets.

Create: api.job_admission checks everything before writing anything (400 with `error.param`, no
job row); api.job_insert commits the job in `queued` (a worker validates its files when it takes
it: `validating_files`) with its lifecycle events and only then sends the job id to the broker, so
a worker never sees a job that is not committed. A retry
with the same `Idempotency-Key` gets the job the first request created, with the same status code.

Quota: a create (or a resume) that would give the key more than `max_active_jobs_per_key` jobs
validating, queued or running is a 429 `quota_exceeded` (api/quotas.py), counted under the owner's
quota lock, so concurrent creates cannot overshoot it.

Cancel/pause/resume go through core.jobstates (request_cancel, request_pause, resume). A cancel
answers `cancelled` at once, even while a worker still holds the job (it reads requests between
steps, about once a second, and stops there); a pause of a held job answers `running` with
`pause_requested: true` until the worker has paused it. A request the job's status does not
allow (cancelling a finished job, resuming a running one) is a 400, not a 409: it will never
succeed, and the openai SDK retries 409s.

List: newest first, `after`/`limit` pages, `status=` and the SDK's `metadata[key]=value` filter
(api/metadata_filter.py), both applied before the page is cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Header, Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import CurrentKey, SessionDep, SettingsDep
from api.errors import APIError
from api.job_admission import admit_job
from api.job_insert import earlier_job, enqueue, insert_job, undo_create, undo_resume
from api.metadata_filter import MAX_VALUE_CHARS, metadata_conditions, parse_metadata_filter
from api.queries import AfterId, bad_cursor, newest_first_after, owned_job
from api.quotas import check_active_jobs, check_room_to_store
from api.request_models import JobCreate
from api.request_text import json_router
from api.schemas import FineTuningJob, ListEnvelope, to_job
from api.waiting import waiting_for, waiting_reasons
from core import jobstates
from core.models import ApiKey, Job
from core.status import JobStatus
from trainer.config import PRESETS, model_config_from_preset, schema

router = json_router(prefix="/v1/fine_tuning", tags=["fine-tuning"])


@router.post("/jobs", response_model=FineTuningJob, summary="Create a training job")
def create_job(
    body: JobCreate,
    request: Request,
    session: SessionDep,
    key: CurrentKey,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> FineTuningJob:
    fingerprint = body.fingerprint()
    if (earlier := earlier_job(session, key.owner_id, idempotency_key, fingerprint)) is not None:
        return to_job(earlier)
    job = admit_job(session, key.owner_id, body, settings)
    # a key past its storage quota could keep no checkpoint or model of the job
    check_room_to_store(
        session, key.owner_id, settings.max_stored_bytes_per_key, "a new job's model and checkpoints"
    )
    job, created = insert_job(session, job, idempotency_key, fingerprint, settings.max_active_jobs_per_key)
    if created:
        enqueue(request, session, job, undo_create)
    return to_job(job, waiting_for(session, job, settings))


# `metadata[key]=value` is a deepObject query parameter, which FastAPI cannot declare itself
METADATA_PARAMETER = {
    "name": "metadata",
    "in": "query",
    "required": False,
    "style": "deepObject",
    "explode": True,
    "description": "only jobs whose metadata holds every pair: metadata[key]=value (what the openai SDK "
    "sends for jobs.list(metadata={...})); metadata=null: only jobs without metadata",
    "schema": {"type": "object", "additionalProperties": {"type": "string", "maxLength": MAX_VALUE_CHARS}},
}


@router.get(
    "/jobs",
    response_model=ListEnvelope[FineTuningJob],
    summary="List your jobs, newest first",
    openapi_extra={"parameters": [METADATA_PARAMETER]},
)
def list_jobs(
    request: Request,
    session: SessionDep,
    key: CurrentKey,
    settings: SettingsDep,
    after: AfterId = None,
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20,
    status: Annotated[JobStatus | None, Query(description="only jobs in this status")] = None,
    metadata: Annotated[
        str | None,
        Query(
            description="metadata[KEY]=VALUE: only jobs whose metadata holds the pair (several: all); "
            "metadata=null: jobs without metadata"
        ),
    ] = None,
) -> ListEnvelope[FineTuningJob]:
    wanted = parse_metadata_filter(request.query_params.multi_items())
    q = select(Job).where(Job.owner_id == key.owner_id)
    if status:
        q = q.where(Job.status == status)
    if wanted.given:
        q = q.where(*metadata_conditions(wanted, session.get_bind().dialect.name))
    if after:
        cursor = session.scalar(select(Job).where(Job.id == after, Job.owner_id == key.owner_id))
        if cursor is None:
            raise bad_cursor(after)
        q = q.where(newest_first_after(Job, cursor))
    rows = session.scalars(q.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)).all()
    reasons = waiting_reasons(session, rows[:limit], settings)
    data = [to_job(j, reasons.get(j.id)) for j in rows[:limit]]
    return ListEnvelope.of(data, has_more=len(rows) > limit)


@router.get("/jobs/{job_id}", response_model=FineTuningJob, summary="Get a job with its progress")
def get_job(job_id: str, session: SessionDep, key: CurrentKey, settings: SettingsDep) -> FineTuningJob:
    job = owned_job(session, key.owner_id, job_id)
    return to_job(job, waiting_for(session, job, settings))


def _control(session: Session, key: ApiKey, job_id: str, action: Callable[[Session, Job], Job]) -> Job:
    job = owned_job(session, key.owner_id, job_id)
    try:
        result = action(session, job)
        session.commit()
    except jobstates.IllegalTransition as e:
        session.rollback()
        raise APIError(400, str(e), param="job_id", code="invalid_status") from e
    return result


@router.post("/jobs/{job_id}/cancel", response_model=FineTuningJob, summary="Cancel a job")
def cancel_job(job_id: str, session: SessionDep, key: CurrentKey) -> FineTuningJob:
    return to_job(_control(session, key, job_id, jobstates.request_cancel))


@router.post(
    "/jobs/{job_id}/pause",
    response_model=FineTuningJob,
    summary="Pause a job (it keeps a checkpoint; resume continues from the same step)",
)
def pause_job(job_id: str, session: SessionDep, key: CurrentKey) -> FineTuningJob:
    return to_job(_control(session, key, job_id, jobstates.request_pause))


@router.post("/jobs/{job_id}/resume", response_model=FineTuningJob, summary="Resume a paused job")
def resume_job(
    job_id: str, request: Request, session: SessionDep, key: CurrentKey, settings: SettingsDep
) -> FineTuningJob:
    needs: dict[str, bool] = {}

    def action(s: Session, job: Job) -> Job:
        if job.status == JobStatus.PAUSED:  # it becomes queued: one more active job
            check_active_jobs(s, key.owner_id, settings.max_active_jobs_per_key)
        job, needs["enqueue"] = jobstates.resume(s, job)
        return job

    job = _control(session, key, job_id, action)
    if needs.get("enqueue"):
        enqueue(request, session, job, undo_resume)
    return to_job(job, waiting_for(session, job, settings))


@router.get("/presets", summary="Model presets and a job's default hyperparameters (our extension)")
def list_presets(key: CurrentKey) -> dict[str, Any]:
    """Each preset's architecture and parameter count (with the byte tokenizer), and the training
    hyperparameters a job gets when its request leaves them out. No client of ours reads it: the
    dashboard's new-job form comes from GET /v1/fine_tuning/hyperparameters."""
    data = []
    for name in PRESETS:
        cfg = model_config_from_preset(name).to_dict()
        cfg.pop("vocab_size", None)  # follows the tokenizer
        data.append(
            {
                "id": name,
                "object": "preset",
                "model": cfg,
                "n_params_byte_tokenizer": model_config_from_preset(name, vocab_size=258).num_params(),
            }
        )
    return {"object": "list", "data": data, "has_more": False, "hyperparameters": _job_defaults()}


def _job_defaults() -> dict[str, Any]:
    """The training hyperparameters a job accepts, at their defaults; OpenAI's "auto" (= the default)
    where the default is unset, as for n_epochs (the length then comes from max_steps)."""
    return {
        h.name: "auto" if h.accepts_auto and h.default is None else h.default
        for h in schema.job_hyperparameters()
        if h.section == "train"
    }
