"""/v1/fine_tuning/jobs: create, list, retrieve, cancel, pause, resume; and /v1/fine_tuning/presets.

Create validates everything before writing anything (400 with `error.param`, no job row), then
commits the job in `validating_files` with its lifecycle events, and only then sends the job id to
the broker (core.broker.enqueue_job), so a worker never sees a job that is not committed.

`Idempotency-Key` header: a retried create with the same key (per owner) returns the job the first
request created, with the same status code; a concurrent duplicate loses on the unique constraint
(owner_id, idempotency_key) and returns the winner's job. The job keeps a fingerprint of the body
that created it (`request_hash`): the same key with a different body is a 400
`idempotency_key_reused`, not the first job.

Quota: a create (or a resume) that would give the key more than `max_active_jobs_per_key` jobs
validating, queued or running is a 429 `quota_exceeded` (api/quotas.py); the count and the insert
happen under the owner's quota lock, so concurrent creates cannot overshoot it.

Cancel/pause/resume go through core.jobstates (request_cancel, request_pause, resume). A cancel
answers `cancelled` at once, even while a worker still holds the job (it stops at its next step);
a pause of a held job answers `running` with `pause_requested: true` until the worker has paused
it. A request the job's status does not allow (cancelling a finished job, resuming a running one)
is a 400, not a 409: it will never succeed, and the openai SDK retries 409s.

List: newest first, `after`/`limit` pages, `status=` and the SDK's `metadata[key]=value` filter
(api/metadata_filter.py), both applied before the page is cut.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Header, Query, Request
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.deps import CurrentKey, SessionDep, SettingsDep
from api.errors import APIError
from api.hyperparams import HyperparameterError, Resolved, check_context, resolve
from api.integration_models import disallowed_tracker
from api.job_limits import JobTooLarge, check_job_limits
from api.metadata_filter import MAX_VALUE_CHARS, metadata_conditions, parse_metadata_filter
from api.queries import (
    AfterId,
    ModelRef,
    bad_cursor,
    find_model,
    live_files,
    newest_first_after,
    owned_job,
)
from api.quotas import check_active_jobs
from api.request_models import MAX_SEED, JobCreate
from api.request_text import json_router
from api.schemas import FineTuningJob, ListEnvelope, to_job
from core import jobstates
from core.device_queues import job_queue
from core.models import ApiKey, Event, File, Job
from core.quotas import lock_owner
from core.settings import Settings
from core.status import JobStatus
from trainer.config import PRESETS, TrainConfig, model_config_from_preset

log = logging.getLogger("fromscratch.api")
router = json_router(prefix="/v1/fine_tuning", tags=["fine-tuning"])


def _bad(message: str, param: str, code: str = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def _owned_training_file(session: Session, owner_id: str, file_id: str, param: str) -> File:
    f = session.scalar(live_files(owner_id).where(File.id == file_id))
    if f is None:
        raise _bad(
            f"{param}: no such file {file_id!r} (upload it with POST /v1/files)", param, "file_not_found"
        )
    if f.purpose != "fine-tune":
        raise _bad(f"{param}: file {file_id} has purpose {f.purpose!r}, not 'fine-tune'", param)
    return f


def _base_model(session: Session, owner_id: str, model: str) -> ModelRef | None:
    """None for a preset; else the caller's model this job continues from (400 if there is none)."""
    if model in PRESETS:
        return None
    parent = find_model(session, owner_id, model)
    if parent is None:
        raise _bad(
            f"Unknown model {model!r}: use a preset ({', '.join(PRESETS)}) or the id of a model you "
            "trained (GET /v1/models)",
            "model",
            "model_not_found",
        )
    if parent.checkpoint is None:
        raise _bad(f"model {model!r} has no stored checkpoint to continue from", "model")
    return parent


def _resolve(
    body: JobCreate, parent: ModelRef | None, seed: int, train_file: File, val_file: File | None
) -> Resolved:
    """The trainer configs of the request, checked against the data's size (400 naming the field)."""
    hyperparameters = body.requested_hyperparameters()
    try:
        if parent is not None:
            resolved = resolve(
                hyperparameters,
                parent_model_config=parent.job.model_config,
                parent_train_config=parent.job.train_config,
                seed=seed,
            )
        else:
            resolved = resolve(hyperparameters, preset=body.model, seed=seed)
        check_context(
            resolved.model_config,
            resolved.train_config,
            train_file.bytes,
            val_file is not None,
            val_file.bytes if val_file is not None else None,
        )
    except HyperparameterError as e:
        raise _bad(e.message, e.param, "invalid_hyperparameter") from e
    return resolved


def _check_limits(
    body: JobCreate,
    resolved: Resolved,
    queue: str,
    train_file: File,
    has_validation_file: bool,
    continuing: bool,
    settings: Settings,
) -> None:
    """400 `job_too_large` naming the field to lower when the job exceeds a limit of the service."""
    try:
        check_job_limits(
            resolved.model_config,
            resolved.train_config,
            queue=queue,
            training_bytes=train_file.bytes,
            has_validation_file=has_validation_file,
            given=set(body.requested_hyperparameters() or {}),
            continuing=continuing,
            settings=settings,
        )
    except JobTooLarge as e:
        raise _bad(e.message, e.param, JobTooLarge.code) from e


def _queue_for(device: str, default: str) -> str:
    if device == "cuda":
        return "gpu"
    if device == "cpu":
        return "cpu"
    return default


def _new_job(session: Session, owner_id: str, body: JobCreate, settings: Settings) -> Job:
    """The job row for a request whose types the model has checked; here what needs the database
    and the limits of settings (api.job_limits: memory, steps, tokens, checkpoints kept)."""
    train_file = _owned_training_file(session, owner_id, body.training_file, "training_file")
    val_file = None
    if body.validation_file is not None:
        val_file = _owned_training_file(session, owner_id, body.validation_file, "validation_file")
    parent = _base_model(session, owner_id, body.model)
    seed = body.seed if body.seed is not None else secrets.randbelow(MAX_SEED)
    resolved = _resolve(body, parent, seed, train_file, val_file)
    queue = _queue_for(resolved.train_config.device, settings.default_queue)
    _check_limits(body, resolved, queue, train_file, val_file is not None, parent is not None, settings)
    if (param := disallowed_tracker(body.integrations, settings.tracker_hosts)) is not None:
        raise _bad(
            f"{param}: this host is not one the service may send runs to (allowed_tracker_hosts="
            f"{settings.allowed_tracker_hosts!r})",
            param,
            "tracker_host_not_allowed",
        )
    return Job(
        owner_id=owner_id,
        model=body.model,
        base_model_id=parent.id if parent else None,
        training_file=train_file.id,
        validation_file=val_file.id if val_file else None,
        status=JobStatus.VALIDATING_FILES,
        hyperparameters=resolved.hyperparameters,
        model_config=resolved.model_config.to_dict(),
        train_config=resolved.train_config.to_dict(),
        seed=seed,
        suffix=body.suffix,
        user_metadata=body.metadata,
        integrations=[i.stored() for i in body.integrations] if body.integrations else None,
        queue=job_queue(queue, resolved.train_config.devices),  # `gpu.4` for 4 devices (core/device_queues)
    )


def _existing(session: Session, owner_id: str, idem: str) -> Job | None:
    return session.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == idem))


def _replayed(job: Job, fingerprint: str) -> FineTuningJob:
    """The job an earlier request with this Idempotency-Key created, if this request is the same
    one again; a different body under the same key is a 400 (it is not a retry)."""
    if job.request_hash is not None and job.request_hash != fingerprint:
        raise APIError(
            400,
            f"This Idempotency-Key was already used with other parameters (for job {job.id}); "
            "send a new key with a new request.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return to_job(job)


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
    if idempotency_key:
        existing = _existing(session, key.owner_id, idempotency_key)
        if existing is not None:
            return _replayed(existing, fingerprint)
    job = _new_job(session, key.owner_id, body, settings)
    # The owner's quota lock, held until the commit below: the count and the insert are one step.
    lock_owner(session, key.owner_id)
    if idempotency_key:  # a concurrent twin may have committed while we waited for the lock
        existing = _existing(session, key.owner_id, idempotency_key)
        if existing is not None:
            return _replayed(existing, fingerprint)
    check_active_jobs(session, key.owner_id, settings.max_active_jobs_per_key)
    job.idempotency_key = idempotency_key or None
    job.request_hash = fingerprint
    session.add(job)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        existing = _existing(session, key.owner_id, idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return _replayed(existing, fingerprint)
    jobstates.add_event(
        session, job.id, f"Created fine-tuning job: {job.id}", data={"status": job.status, "model": job.model}
    )
    jobstates.add_event(session, job.id, f"Validating training file: {job.training_file}")
    try:
        session.commit()
    except IntegrityError:  # a concurrent request with the same Idempotency-Key won
        session.rollback()
        existing = _existing(session, key.owner_id, idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return _replayed(existing, fingerprint)
    _enqueue(request, session, job, _undo_create)
    return to_job(job)


def _enqueue(request: Request, session: Session, job: Job, undo: Callable[[Session, Job], None]) -> None:
    """Send the job id to the broker (after the commit). If the broker refuses, `undo(session, job)`
    takes the change back and the request fails with 503, so a retry (the SDK retries 5xx with
    the same Idempotency-Key) starts over instead of finding a job no worker will ever hear of."""
    from core.broker import enqueue_job

    try:
        enqueue_job(request.app.state.celery, job.id, job.queue)
    except Exception as e:  # noqa: BLE001 - any broker failure
        log.exception("could not enqueue job %s", job.id)
        session.rollback()
        session.refresh(job)
        undo(session, job)
        session.commit()
        raise APIError(
            503,
            f"The job could not be queued: the broker is unreachable ({type(e).__name__}). "
            "Nothing was changed; try again later (GET /readyz shows when the service is ready).",
            code="broker_unavailable",
        ) from e


def _undo_create(session: Session, job: Job) -> None:
    session.execute(delete(Event).where(Event.job_id == job.id))
    session.execute(delete(Job).where(Job.id == job.id))


def _undo_resume(session: Session, job: Job) -> None:
    if job.status == JobStatus.QUEUED and job.lease_owner is None:
        jobstates.transition(session, job, JobStatus.PAUSED)


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
    after: AfterId = None,
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20,
    status: Annotated[JobStatus | None, Query(description="only jobs in this status")] = None,
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
    data = [to_job(j) for j in rows[:limit]]
    return ListEnvelope.of(data, has_more=len(rows) > limit)


@router.get("/jobs/{job_id}", response_model=FineTuningJob, summary="Get a job with its progress")
def get_job(job_id: str, session: SessionDep, key: CurrentKey) -> FineTuningJob:
    return to_job(owned_job(session, key.owner_id, job_id))


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
        _enqueue(request, session, job, _undo_resume)
    return to_job(job)


@router.get("/presets", summary="Model presets and the default hyperparameters (our extension)")
def list_presets(key: CurrentKey) -> dict[str, Any]:
    """What the dashboard shows as defaults in its new-job form."""
    train_defaults = TrainConfig().to_dict()
    train_defaults.pop("extra", None)
    train_defaults.pop("seed", None)
    data = []
    for name in PRESETS:
        cfg = model_config_from_preset(name).to_dict()
        cfg.pop("vocab_size", None)
        data.append(
            {
                "id": name,
                "object": "preset",
                "model": cfg,
                "n_params_byte_tokenizer": model_config_from_preset(name, vocab_size=258).num_params(),
            }
        )
    return {
        "object": "list",
        "data": data,
        "has_more": False,
        "hyperparameters": {
            "n_epochs": "auto",
            "batch_size": train_defaults["batch_size"],
            "learning_rate_multiplier": "auto",
            **train_defaults,
        },
    }
