"""Admission of a new job: every check a create request must pass before anything is written.

`admit_job` turns a request whose types api.request_models has checked into an unsaved Job row, or
raises a 400 naming the field (`error.param`): the files (the caller's, purpose fine-tune), the
base model (a preset or a model the caller trained, with a checkpoint), the hyperparameters
resolved into the trainer's configs and checked against the data, the limits of the service
(api.job_limits: memory, steps, tokens, checkpoints, devices), and the experiment trackers' hosts.
The quota and the insert come after it (api.job_insert).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy.orm import Session

from api.errors import APIError
from api.hyperparams import HyperparameterError, Resolved, check_context, resolve
from api.integration_models import disallowed_tracker
from api.job_limits import JobTooLarge, check_job_limits, check_max_steps
from api.placement import gpu_queue_without_cuda, training_queue
from api.queries import ModelRef, find_model, live_files
from api.request_models import MAX_SEED, JobCreate
from core.device_queues import job_queue
from core.models import UPLOAD_PURPOSE, File, Job
from core.settings import Settings
from core.status import JobStatus
from trainer.config import PRESETS


def _bad(message: str, param: str, code: str = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def _owned_training_file(session: Session, owner_id: str, file_id: str, param: str) -> File:
    f = session.scalar(live_files(owner_id).where(File.id == file_id))
    if f is None:
        raise _bad(
            f"{param}: no such file {file_id!r} (upload it with POST /v1/files)", param, "file_not_found"
        )
    if f.purpose != UPLOAD_PURPOSE:
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
            train_file.token_bound,
            val_file is not None,
            val_file.token_bound if val_file is not None else None,
        )
    except HyperparameterError as e:
        raise _bad(e.message, e.param, "invalid_hyperparameter") from e
    _check_something_to_learn(resolved, train_file, val_file)
    return resolved


def _check_something_to_learn(resolved: Resolved, train_file: File, val_file: File | None) -> None:
    """A file whose loss would cover no token (a chat file without assistant turns, completions all
    empty) trains or measures nothing: 400 naming it, as its worker would fail it."""
    cfg = resolved.train_config
    if cfg.train_on_inputs:
        return
    files = [("training_file", train_file)]
    if val_file is not None and cfg.eval_every != 0:
        files.append(("validation_file", val_file))
    for param, file in files:
        if file.max_trained_tokens == 0:
            raise _bad(
                f"{param} {file.id} ({file.filename}) has nothing for the loss to cover: no record has a "
                "non-empty completion or assistant message (of weight 1). Add them, or set the "
                "hyperparameter train_on_inputs to train on every token.",
                param,
                "invalid_training_file",
            )


def _check_max_steps(body: JobCreate, settings: Settings) -> None:
    """max_steps over the service's limit: refused as too long before the trainer's bound is checked."""
    try:
        check_max_steps((body.requested_hyperparameters() or {}).get("max_steps"), settings.max_job_steps)
    except JobTooLarge as e:
        raise _bad(e.message, e.param, JobTooLarge.code) from e


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
            training_tokens=train_file.token_bound,
            has_validation_file=has_validation_file,
            given=set(body.requested_hyperparameters() or {}),
            continuing=continuing,
            settings=settings,
        )
    except JobTooLarge as e:
        raise _bad(e.message, e.param, JobTooLarge.code) from e


@dataclass(frozen=True)
class ResolvedRequest:
    """A create request resolved: its files, base model, seed, trainer configs and training queue."""

    train_file: File
    val_file: File | None
    parent: ModelRef | None
    seed: int
    resolved: Resolved
    queue: str  # cpu | gpu (api/placement.py)


def resolve_request(session: Session, owner_id: str, body: JobCreate, settings: Settings) -> ResolvedRequest:
    """Every check before the limits (400 naming the field); the live estimate stops here too
    (api/job_estimate.py), then shows the limits' verdict beside its numbers."""
    train_file = _owned_training_file(session, owner_id, body.training_file, "training_file")
    val_file = None
    if body.validation_file is not None:
        val_file = _owned_training_file(session, owner_id, body.validation_file, "validation_file")
    parent = _base_model(session, owner_id, body.model)
    seed = body.seed if body.seed is not None else secrets.randbelow(MAX_SEED)
    _check_max_steps(body, settings)
    resolved = _resolve(body, parent, seed, train_file, val_file)
    if resolved.train_config.device == "cuda" and gpu_queue_without_cuda(session, settings):
        raise _bad(
            "device: cuda was asked for, but the training workers of this service have no CUDA device "
            "(GET /v1/workers); use auto or cpu",
            "device",
        )
    queue = training_queue(session, resolved.train_config.device, settings)
    return ResolvedRequest(train_file, val_file, parent, seed, resolved, queue)


def check_limits(body: JobCreate, request: ResolvedRequest, settings: Settings) -> None:
    """400 `job_too_large` naming the field to lower when the job exceeds a limit of the service."""
    _check_limits(
        body,
        request.resolved,
        request.queue,
        request.train_file,
        request.val_file is not None,
        request.parent is not None,
        settings,
    )


def admit_job(session: Session, owner_id: str, body: JobCreate, settings: Settings) -> Job:
    """The job row for a request whose types the model has checked; here what needs the database
    and the limits of settings (api.job_limits: memory, steps, tokens, checkpoints kept)."""
    request = resolve_request(session, owner_id, body, settings)
    check_limits(body, request, settings)
    train_file, val_file, parent, seed, resolved, queue = (
        request.train_file,
        request.val_file,
        request.parent,
        request.seed,
        request.resolved,
        request.queue,
    )
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
        status=JobStatus.QUEUED,  # waiting for a worker, which validates the files (worker.job_run)
        hyperparameters=resolved.hyperparameters,
        model_config=resolved.model_config.to_dict(),
        train_config=resolved.train_config.to_dict(),
        seed=seed,
        suffix=body.suffix,
        user_metadata=body.metadata,
        integrations=[i.stored() for i in body.integrations] if body.integrations else None,
        queue=job_queue(queue, resolved.train_config.devices),  # `gpu.4` for 4 devices (core/device_queues)
    )
