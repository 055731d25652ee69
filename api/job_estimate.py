"""The live estimate of a job the new-job form shows as the user types (POST
/v1/fine_tuning/jobs/estimate): the request goes through admission's own checks and arithmetic
(api.job_admission.resolve_request, api.job_limits.job_size), so the numbers are the ones a create
would be judged by, and the limits' verdict comes with them (`problem`: the 400 a create would get).

Time on the chosen worker class: the job's training compute (about 6 x parameters FLOPs per token,
the weight matmuls; attention's share is left out; a validation token, a forward pass, a third of
that) over the rate recent jobs of the same worker class (its broker queue: `gpu`, `cpu.2`, ...)
achieved, wall-clock from start to finish, evaluations and
checkpoints included: parameters x tokens / seconds, the median of up to RATE_JOBS jobs. None until a
job of that class has succeeded. Only that aggregate leaves the table, never another owner's job.
"""

from __future__ import annotations

import statistics
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import APIError
from api.job_admission import check_limits, resolve_request
from api.job_limits import JobTooLarge, job_size, worker_memory_limit
from api.request_models import JobCreate
from core.device_queues import job_queue
from core.models import Job
from core.settings import Settings
from core.status import JobStatus
from trainer.config import ConfigError, ModelConfig
from trainer.config.estimate import tokens_per_step

RATE_JOBS = 20  # recent succeeded jobs of the worker class the rate is the median of


def _parameter_tokens_per_second(job: Job) -> float | None:
    """What a finished job achieved: parameters x tokens trained / seconds from start to finish."""
    if not (job.started_at and job.finished_at and job.trained_tokens):
        return None
    seconds = (job.finished_at - job.started_at).total_seconds()
    try:
        params = ModelConfig.from_dict(job.model_config).num_params()
    except (ConfigError, ValueError, TypeError):
        return None
    return params * job.trained_tokens / seconds if seconds > 0 else None


def class_rate(session: Session, broker_queue: str) -> tuple[float | None, int]:
    """(median parameter-tokens per second, jobs it is measured on) of a worker class."""
    rows = session.scalars(
        select(Job)
        .where(
            Job.queue == broker_queue,
            Job.status == JobStatus.SUCCEEDED,
            Job.trained_tokens > 0,
            Job.started_at.is_not(None),
            Job.finished_at > Job.started_at,
        )
        .order_by(Job.finished_at.desc())
        .limit(RATE_JOBS)
    ).all()
    rates = [r for r in map(_parameter_tokens_per_second, rows) if r]
    return (statistics.median(rates) if rates else None), len(rates)


def estimate_job(session: Session, owner_id: str, body: JobCreate, settings: Settings) -> dict[str, Any]:
    """The estimate's body; 400s (APIError) as a create would answer them, except the limits."""
    request = resolve_request(session, owner_id, body, settings)
    model_cfg, train_cfg = request.resolved.model_config, request.resolved.train_config
    size = job_size(
        model_cfg, train_cfg, request.queue, request.train_file.token_bound, request.val_file is not None
    )
    problem = None
    try:
        check_limits(body, request, settings)
    except APIError as e:  # the 400 a create would answer: said beside the numbers
        if not isinstance(e.__cause__, JobTooLarge):
            raise
        problem = {"message": e.__cause__.message, "param": e.__cause__.param}
    broker_queue = job_queue(request.queue, train_cfg.devices)
    rate, measured_on = class_rate(session, broker_queue)
    params = model_cfg.num_params()
    return {
        "object": "fine_tuning.job.estimate",
        "queue": broker_queue,
        "device": size.device,
        "parameters": params,
        "memory_bytes": size.memory.total,
        "memory_limit_bytes": worker_memory_limit(request.queue, settings),
        "steps": size.steps,
        "tokens_per_step": tokens_per_step(train_cfg, model_cfg.ctx),
        "tokens": size.tokens,
        "eval_tokens": size.eval_tokens,
        "seconds": round(params * (size.tokens + size.eval_tokens / 3) / rate, 1) if rate else None,
        "rate_jobs": measured_on,
        "problem": problem,
    }
