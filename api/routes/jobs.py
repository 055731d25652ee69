"""/v1/fine_tuning/jobs: create, list, retrieve, cancel, pause, resume; and /v1/fine_tuning/presets.

Create validates everything before writing anything (400 with `error.param`, no job row), then
commits the job in `validating_files` with its lifecycle events, and only then sends the job id to
the broker (core.broker.enqueue_job), so a worker never sees a job that is not committed.

`Idempotency-Key` header: a retried create with the same key (per owner) returns the job the first
request created, with the same status code; a concurrent duplicate loses on the unique constraint
(owner_id, idempotency_key) and returns the winner's job.

Cancel/pause/resume go through core.jobstates (request_cancel, request_pause, resume). A request
the job's status does not allow (cancelling a finished job, resuming a running one) is a 400, not a
409: it will never succeed, and the openai SDK retries 409s.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.deps import CurrentKey, SessionDep, SettingsDep
from api.errors import APIError
from api.hyperparams import HyperparameterError, check_context, resolve
from api.queries import bad_cursor, check_limit, find_model, live_files, newest_first_after, owned_job
from api.schemas import FineTuningJob, JobCreate, ListEnvelope, to_job
from core import jobstates
from core.models import Event, File, Job
from trainer.config import PRESETS, TrainConfig, model_config_from_preset

log = logging.getLogger("fromscratch.api")
router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])

KNOWN_FIELDS = set(JobCreate.model_fields)
SUFFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_SEED = 2**31 - 1


def _bad(message: str, param: str, code: str = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def _owned_training_file(session: Session, owner_id: str, file_id: Any, param: str) -> File:
    if not isinstance(file_id, str) or not file_id:
        raise _bad(f"{param} must be the id of a file you uploaded (POST /v1/files)", param)
    f = session.scalar(live_files(owner_id).where(File.id == file_id))
    if f is None:
        raise _bad(
            f"{param}: no such file {file_id!r} (upload it with POST /v1/files)", param, "file_not_found"
        )
    if f.purpose != "fine-tune":
        raise _bad(f"{param}: file {file_id} has purpose {f.purpose!r}, not 'fine-tune'", param)
    return f


def _hyperparameters(body: JobCreate) -> Any:
    """Hyperparameters from the top level or from method.supervised (not both)."""
    top = body.hyperparameters
    method = body.method
    if method is None:
        return top
    if not isinstance(method, dict):
        raise _bad(
            'method must be an object like {"type": "supervised", "supervised": {"hyperparameters": {...}}}',
            "method",
        )
    mtype = method.get("type", "supervised")
    if mtype != "supervised":
        raise _bad(
            f"method.type {mtype!r} is not supported: only 'supervised' (training from the data)",
            "method.type",
        )
    unknown = [k for k in method if k not in ("type", "supervised")]
    if unknown:
        raise _bad(f"unknown field method.{unknown[0]}", f"method.{unknown[0]}")
    supervised = method.get("supervised") or {}
    if not isinstance(supervised, dict):
        raise _bad("method.supervised must be an object with `hyperparameters`", "method.supervised")
    unknown = [k for k in supervised if k != "hyperparameters"]
    if unknown:
        raise _bad(f"unknown field method.supervised.{unknown[0]}", f"method.supervised.{unknown[0]}")
    inner = supervised.get("hyperparameters")
    if inner is not None and top is not None:
        raise _bad(
            "give hyperparameters either at the top level or in method.supervised, not both",
            "hyperparameters",
        )
    return inner if inner is not None else top


def _queue_for(device: str, default: str) -> str:
    if device == "cuda":
        return "gpu"
    if device == "cpu":
        return "cpu"
    return default


def _validate_create(session: Session, owner_id: str, body: JobCreate, default_queue: str) -> Job:
    extra = sorted((body.model_extra or {}).keys())
    if extra:
        raise _bad(f"Unrecognized request argument supplied: {extra[0]}", extra[0], "unknown_parameter")
    if body.integrations not in (None, []):
        raise _bad("integrations are not supported", "integrations")
    model = body.model
    if not isinstance(model, str) or not model:
        raise _bad(
            f"model is required: a preset ({', '.join(PRESETS)}) or the id of a model you trained", "model"
        )
    if body.training_file is None:
        raise _bad(
            "training_file is required: the id of a file you uploaded (POST /v1/files)", "training_file"
        )
    train_file = _owned_training_file(session, owner_id, body.training_file, "training_file")
    val_file = None
    if body.validation_file is not None:
        val_file = _owned_training_file(session, owner_id, body.validation_file, "validation_file")
    seed = body.seed
    if seed is None:
        seed = secrets.randbelow(MAX_SEED)
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise _bad(f"seed must be an integer between 0 and {MAX_SEED}, got {seed!r}", "seed")
    suffix = body.suffix
    if suffix is not None and (not isinstance(suffix, str) or not SUFFIX_RE.match(suffix)):
        raise _bad("suffix must be 1-64 characters of letters, digits, '_', '-', '.' (no ':')", "suffix")
    metadata = body.metadata
    if metadata is not None:
        if (
            not isinstance(metadata, dict)
            or len(metadata) > 16
            or not all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                for k, v in metadata.items()
            )
        ):
            raise _bad(
                "metadata must be an object of at most 16 string keys (<= 64 chars) with string values "
                "(<= 512 chars)",
                "metadata",
            )
    raw_hp = _hyperparameters(body)

    parent = None
    if model not in PRESETS:
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
    try:
        if parent is not None:
            resolved = resolve(
                raw_hp,
                parent_model_config=parent.job.model_config,
                parent_train_config=parent.job.train_config,
                seed=seed,
            )
        else:
            resolved = resolve(raw_hp, preset=model, seed=seed)
        check_context(
            resolved.model_config,
            resolved.train_config,
            train_file.bytes,
            val_file is not None,
            val_file.bytes if val_file is not None else None,
        )
    except HyperparameterError as e:
        raise _bad(e.message, e.param, "invalid_hyperparameter") from e
    return Job(
        owner_id=owner_id,
        model=model,
        base_model_id=parent.id if parent else None,
        training_file=train_file.id,
        validation_file=val_file.id if val_file else None,
        status=jobstates.VALIDATING_FILES,
        hyperparameters=resolved.hyperparameters,
        model_config=resolved.model_config.to_dict(),
        train_config=resolved.train_config.to_dict(),
        seed=seed,
        suffix=suffix,
        user_metadata=metadata,
        queue=_queue_for(resolved.train_config.device, default_queue),
    )


def _existing(session: Session, owner_id: str, idem: str) -> Job | None:
    return session.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == idem))


@router.post("/jobs", response_model=FineTuningJob, summary="Create a training job")
def create_job(
    body: JobCreate,
    request: Request,
    session: SessionDep,
    key: CurrentKey,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> FineTuningJob:
    if idempotency_key:
        existing = _existing(session, key.owner_id, idempotency_key)
        if existing is not None:
            return to_job(existing)
    job = _validate_create(session, key.owner_id, body, settings.default_queue)
    job.idempotency_key = idempotency_key or None
    session.add(job)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        existing = _existing(session, key.owner_id, idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return to_job(existing)
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
        return to_job(existing)
    _enqueue(request, session, job, _undo_create)
    return to_job(job)


def _enqueue(request: Request, session: Session, job: Job, undo: Any) -> None:
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
    if job.status == jobstates.QUEUED and job.lease_owner is None:
        jobstates.transition(session, job, jobstates.PAUSED)


@router.get("/jobs", response_model=ListEnvelope[FineTuningJob], summary="List your jobs, newest first")
def list_jobs(
    session: SessionDep,
    key: CurrentKey,
    after: str | None = None,
    limit: Annotated[int, Query()] = 20,
    status: str | None = None,
) -> ListEnvelope[FineTuningJob]:
    check_limit(limit, 100)
    q = select(Job).where(Job.owner_id == key.owner_id)
    if status:
        q = q.where(Job.status == status)
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


def _control(session: Session, key: Any, job_id: str, action: Any) -> Job:
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
def resume_job(job_id: str, request: Request, session: SessionDep, key: CurrentKey) -> FineTuningJob:
    needs: dict[str, bool] = {}

    def action(s: Session, job: Job) -> Job:
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
