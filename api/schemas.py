"""Response models of the public API (requests: api/request_models.py), shaped like OpenAI's so the `openai` SDK parses
them, plus our extensions beside OpenAI's fields (`progress`, `config`, file `format`/`sha256`,
model `kind`/`job_id`/`step`). Times are unix seconds, as in OpenAI's API.

The `to_*` functions turn database rows into these models; routes never hand rows out directly.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Generic, Literal, Protocol, TypeVar, cast

from pydantic import BaseModel, Field

from core.exports import DOWNLOAD_FORMATS
from core.jobstates import EventLevel
from core.models import Checkpoint as CheckpointRow
from core.models import Event as EventRow
from core.models import File as FileRow
from core.models import Job as JobRow
from core.models import Metric as MetricRow
from core.status import ACTIVE, TERMINAL, JobStatus
from trainer.config import ConfigError, TrainConfig, estimate
from trainer.config.metrics import METRICS, OPENAI_NAMES, STORED

T = TypeVar("T")


class _Identified(Protocol):
    """What ListEnvelope.of needs of an item: an `id`."""

    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=_Identified)


def unix(dt: datetime | None) -> int | None:
    """Unix seconds; naive datetimes (SQLite) are UTC."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp())


def unix_float(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


class ListEnvelope(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    @staticmethod
    def of(data: list[Item], has_more: bool = False) -> ListEnvelope[Item]:
        """An envelope whose first_id/last_id are those of `data` (items with an `id`)."""
        return ListEnvelope(
            data=data,
            has_more=has_more,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
        )


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True


# ------------------------------------------------------------------------------------------- files
class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None
    expires_at: int | None = None
    # ours
    format: str = Field(
        description='"text" or "jsonl" (training data, as detected on upload), "csv" (a job\'s '
        "`fine-tune-results` file)"
    )
    sha256: str


def to_file(f: FileRow) -> FileObject:
    return FileObject(
        id=f.id,
        bytes=f.bytes,
        created_at=unix(f.created_at) or 0,
        filename=f.filename,
        purpose=f.purpose,
        format=f.format,
        sha256=f.sha256,
    )


# -------------------------------------------------------------------------------------------- jobs
class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class Progress(BaseModel):
    step: int
    total_steps: int | None
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    eta_seconds: float | None


class Method(BaseModel):
    type: Literal["supervised"] = "supervised"
    supervised: dict[str, Any]


class FineTuningJob(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    finished_at: int | None
    model: str
    fine_tuned_model: str | None
    organization_id: str
    status: JobStatus
    hyperparameters: dict[str, Any]
    training_file: str
    validation_file: str | None
    result_files: list[str] = Field(
        default_factory=list,
        description="the `fine-tune-results` CSV of a succeeded job (GET /v1/files/{id}/content)",
    )
    trained_tokens: int | None
    error: JobError | None
    seed: int
    suffix: str | None = None
    estimated_finish: int | None
    integrations: list[dict[str, Any]] | None = Field(
        None, description="the experiment trackers this job logs to, as created (wandb, mlflow)"
    )
    metadata: dict[str, Any] | None
    method: Method
    # ours
    progress: Progress
    config: dict[str, Any] = Field(
        description="the resolved trainer configs: {model: ModelConfig, train: TrainConfig}"
    )
    queue: str
    attempts: int
    started_at: int | None
    base_model: str | None = Field(None, description="the model this job continues training from, if any")
    pause_requested: bool = Field(
        False,
        description="a pause was asked of the running job: it stays `running` until its worker has "
        "saved a checkpoint and stopped, then it is `paused`",
    )
    waiting_for: str | None = Field(
        None,
        description="why a job waiting to be claimed cannot start now (no live worker consumes its "
        "queue; its key runs max_running_jobs_per_key jobs); null while it runs, ends, or waits its turn",
    )


def tokens_per_step(job: JobRow) -> int | None:
    """The job's tokens per optimizer step over all its devices (None: its configs do not load)."""
    try:
        train_cfg = TrainConfig.from_dict(job.train_config or {})
        return estimate.tokens_per_step(train_cfg, int(job.model_config["ctx"]))
    except (ConfigError, KeyError, TypeError, ValueError):
        return None


def eta_seconds(job: JobRow) -> float | None:
    if job.status not in ACTIVE or not job.total_steps or not job.tokens_per_s:
        return None
    per_step = tokens_per_step(job)
    if not per_step or job.tokens_per_s <= 0:
        return None
    remaining = max(job.total_steps - job.step, 0)
    return round(remaining * per_step / job.tokens_per_s, 1)


def to_job(job: JobRow, waiting_for: str | None = None) -> FineTuningJob:
    eta = eta_seconds(job)
    error = None
    if job.status == JobStatus.FAILED or job.error_code:
        error = JobError(
            code=job.error_code or "failed",
            message=job.error_message or "The job failed.",
            param=job.error_param,
        )
    hp = dict(job.hyperparameters or {})
    return FineTuningJob(
        id=job.id,
        created_at=unix(job.created_at) or 0,
        finished_at=unix(job.finished_at),
        model=job.model,
        fine_tuned_model=job.fine_tuned_model,
        organization_id=job.owner_id,
        status=JobStatus(job.status),
        hyperparameters=hp,
        training_file=job.training_file,
        validation_file=job.validation_file,
        result_files=list(job.result_files or []),
        trained_tokens=job.trained_tokens
        if job.status == JobStatus.SUCCEEDED or job.trained_tokens
        else None,
        error=error,
        seed=job.seed,
        suffix=job.suffix,
        estimated_finish=int(time.time() + eta) if eta is not None else None,
        integrations=list(job.integrations) if job.integrations else None,
        metadata=job.user_metadata,
        method=Method(supervised={"hyperparameters": hp}),
        progress=Progress(
            step=job.step,
            total_steps=job.total_steps,
            train_loss=job.train_loss,
            val_loss=job.val_loss,
            tokens_per_s=job.tokens_per_s,
            eta_seconds=eta,
        ),
        config={"model": job.model_config, "train": job.train_config},
        queue=job.queue,
        attempts=job.attempts,
        started_at=unix(job.started_at),
        base_model=job.base_model_id,
        pause_requested=bool(job.pause_requested) and job.status not in TERMINAL,
        waiting_for=waiting_for,
    )


# ------------------------------------------------------------------------------------------ events
class JobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: EventLevel
    message: str
    type: Literal["message", "metrics"] = "message"
    data: dict[str, Any] | None = None


def job_hex(job_id: str) -> str:
    return job_id.split("-", 1)[-1]


def metric_event_id(job_id: str, step: int) -> str:
    """Metric rows have no id of their own; their events are `ftevent-<job hex>-s<step>`."""
    return f"ftevent-{job_hex(job_id)}-s{step}"


def metric_data(m: MetricRow) -> dict[str, Any]:
    """A metrics event's `data`: the row's values under OpenAI's names (trainer.config.metrics)."""
    return {"step": m.step, **{OPENAI_NAMES[spec.name]: getattr(m, spec.name) for spec in STORED}}


def metric_message(m: MetricRow, total_steps: int | None) -> str:
    parts = [f"Step {m.step}" + (f"/{total_steps}" if total_steps else "") + ":"]
    if m.train_loss is not None:
        parts.append(f"training loss={m.train_loss:.4f}")
    if m.val_loss is not None:
        parts.append(f"validation loss={m.val_loss:.4f}")
    return " ".join(parts)


def to_metric_event(job_id: str, m: MetricRow, total_steps: int | None) -> JobEvent:
    return JobEvent(
        id=metric_event_id(job_id, m.step),
        created_at=unix(m.created_at) or 0,
        level="info",
        message=metric_message(m, total_steps),
        type="metrics",
        data=metric_data(m),
    )


def to_event(e: EventRow) -> JobEvent:
    kind: Literal["message", "metrics"] = "metrics" if e.type == "metrics" else "message"
    # add_event writes only EventLevel values (a test checks every writer); pydantic checks it again
    level = cast(EventLevel, e.level)
    return JobEvent(
        id=e.id, created_at=unix(e.created_at) or 0, level=level, message=e.message, type=kind, data=e.data
    )


def metric_point(m: MetricRow) -> dict[str, Any]:
    """One point of GET /metrics and of the SSE `metrics` event: the row's columns."""
    return {
        "step": m.step,
        **{spec.name: getattr(m, spec.name) for spec in STORED},
        "created_at": unix_float(m.created_at),
    }


# ------------------------------------------------------------------------------------- checkpoints
class CheckpointObject(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    step_number: int
    metrics: dict[str, Any]
    # ours
    is_final: bool = False


# a checkpoint's metrics as OpenAI names them (None where not measured; full_valid_* on the final one)
CHECKPOINT_METRICS = tuple(OPENAI_NAMES[spec.name] for spec in METRICS if spec.checkpoint)


def to_checkpoint(c: CheckpointRow) -> CheckpointObject:
    metrics = {"step": c.step, **dict.fromkeys(CHECKPOINT_METRICS), **(c.metrics or {})}
    if "val_loss" in metrics and metrics.get("valid_loss") is None:
        metrics["valid_loss"] = metrics["val_loss"]
    return CheckpointObject(
        id=c.id,
        created_at=unix(c.created_at) or 0,
        fine_tuned_model_checkpoint=c.model_id,
        fine_tuning_job_id=c.job_id,
        step_number=c.step,
        metrics=metrics,
        is_final=c.is_final,
    )


# ------------------------------------------------------------------------------------------ models
class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    # ours
    kind: Literal["base", "fine_tuned", "checkpoint"] = Field(
        description="base: a preset architecture to train (no weights); fine_tuned: a job's model; "
        "checkpoint: one of its checkpoints"
    )
    job_id: str | None = Field(description="the job that trained it (none for a base model)")
    step: int | None = None
    root: str | None = Field(None, description="the preset the model's architecture comes from")
    parent: str | None = Field(None, description="the model this one continued training from")
    max_model_len: int | None = Field(
        None, description="its context length in tokens (vLLM's name): the longest prompt it scores"
    )
    formats: list[str] = Field(
        default_factory=lambda: list(DOWNLOAD_FORMATS),
        description="the `format`s it downloads as (GET /v1/fine_tuning/export_formats describes them)",
    )


class GenerateResponse(BaseModel):
    object: Literal["text_completion"] = "text_completion"
    model: str
    text: str
    usage: dict[str, int] | None = None
