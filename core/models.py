"""SQLAlchemy 2.0 models. Alembic (migrations/) is the only thing that changes the schema.

Ids are strings with OpenAI-style prefixes (file-, ftjob-, ftevent-, ftckpt-, ...). Every row a
user can see carries `owner_id` (the API key's owner); queries filter by it so another owner's
ids read as 404.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    and_,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement

from core.status import CLAIMABLE


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend. SQLite has no timezone type and hands back
    naive values, which would break comparisons with `utcnow()`; this stores UTC and always
    returns aware UTC datetimes, so Postgres and SQLite behave the same."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: use timezone-aware UTC datetimes")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Deterministic constraint names on every backend, so migrations (including SQLite batch mode)
# can refer to them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime()}


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key"))
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[str] = mapped_column(String(64), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Blob(Base):
    """Bytes kept by the blob store. `complete` flips to true in the same commit that makes the
    blob reachable, so a half-written upload is never visible (and is garbage-collected)."""

    __tablename__ = "blobs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("blob"))
    backend: Mapped[str] = mapped_column(String(8))  # "db" | "fs" | "s3" (core/blob_backends/)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    # fs: the path under blob_dir; s3: the object key (prefix included) in the bucket
    path: Mapped[str | None] = mapped_column(Text, default=None)
    complete: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # while incomplete: the process writing it ("<host>:<pid>") and its last sign of life
    # (core/blob_writers.py); a stale heartbeat is a dead writer's blob, for gc_incomplete
    writer: Mapped[str | None] = mapped_column(String(200), default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)


class BlobChunk(Base):
    __tablename__ = "blob_chunks"
    blob_id: Mapped[str] = mapped_column(ForeignKey("blobs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


# A file's purpose: a user's upload (OpenAI's name for training data), or a job's metrics CSV
# (worker/result_file.py); the API's list filter takes exactly these.
FilePurpose = Literal["fine-tune", "fine-tune-results"]
UPLOAD_PURPOSE: FilePurpose = "fine-tune"
RESULTS_PURPOSE: FilePurpose = "fine-tune-results"


class File(Base):
    __tablename__ = "files"
    # an upload's Idempotency-Key, unique per owner: a retried upload gets the first file back
    __table_args__ = (UniqueConstraint("owner_id", "idempotency_key", name="uq_files_owner_idempotency"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("file"))
    owner_id: Mapped[str] = mapped_column(String(64), index=True)
    filename: Mapped[str] = mapped_column(String(500))
    purpose: Mapped[str] = mapped_column(String(32))  # UPLOAD_PURPOSE, or a job's results file's
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    format: Mapped[str] = mapped_column(String(16))  # "text" | "jsonl" (uploads) | "csv" (results)
    # at most this many tokens train (trainer.data.formats.FileSummary.max_tokens); None: a file
    # stored before it was measured (migration 0011), whose bytes bound it instead
    max_tokens: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # the same bound for the tokens the loss covers without train_on_inputs (migration 0013): 0 is
    # nothing to learn; None: every token trains (plain text), or a file stored before it was measured
    max_trained_tokens: Mapped[int | None] = mapped_column(BigInteger, default=None)

    @property
    def token_bound(self) -> int:
        """An upper bound of the tokens this file gives, what admission sizes a job by."""
        return self.max_tokens if self.max_tokens is not None else self.bytes

    blob_id: Mapped[str | None] = mapped_column(ForeignKey("blobs.id"))  # None once deleted
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A deleted file that finished jobs still name keeps its row (their training_file stays a valid
    # reference) with its bytes freed; it is gone for every route.
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key", name="uq_jobs_owner_idempotency"),
        Index("ix_jobs_status_lease", "status", "lease_expires_at"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ftjob"))
    owner_id: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(200))  # preset name or parent model id, as requested
    base_model_id: Mapped[str | None] = mapped_column(String(200), default=None)  # continue from this model
    training_file: Mapped[str] = mapped_column(ForeignKey("files.id"))
    validation_file: Mapped[str | None] = mapped_column(ForeignKey("files.id"), default=None)
    status: Mapped[str] = mapped_column(String(20), index=True)
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(default=dict)  # as the user sent them, resolved
    model_config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # trainer.config.ModelConfig.to_dict()
    train_config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # trainer.config.TrainConfig.to_dict()
    seed: Mapped[int] = mapped_column(BigInteger)
    suffix: Mapped[str | None] = mapped_column(String(64), default=None)
    user_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, default=None)
    # OpenAI's `integrations` as validated at creation: [{"type": "wandb", "wandb": {...}}, ...]
    integrations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    # sha256 of the create request's body (api.request_models.JobCreate.fingerprint): the same
    # Idempotency-Key with another body is refused (None for jobs created before it was recorded)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    queue: Mapped[str] = mapped_column(String(16), default="cpu")
    fine_tuned_model: Mapped[str | None] = mapped_column(String(200), default=None)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    error_message: Mapped[str | None] = mapped_column(Text, default=None)
    error_param: Mapped[str | None] = mapped_column(String(64), default=None)
    # requests recorded by the API, obeyed by the worker between steps
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    pause_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # lease held by the worker running the job
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    # progress, denormalised from metrics for cheap job reads
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer, default=None)
    trained_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    train_loss: Mapped[float | None] = mapped_column(Float, default=None)
    val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, default=None)
    # ids of the File rows written when the job succeeded (the `fine-tune-results` CSV)
    result_files: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    @property
    def is_unclaimed(self) -> bool:
        """Waiting for a worker: in a claimable status, and no worker holds it."""
        return self.status in CLAIMABLE and self.lease_owner is None

    @classmethod
    def unclaimed(cls) -> ColumnElement[bool]:
        """`is_unclaimed` as a condition on `jobs` rows."""
        return and_(cls.status.in_(CLAIMABLE), cls.lease_owner.is_(None))


class Metric(Base):
    """One row per logged step; an evaluation at the same step fills val_loss of that row."""

    __tablename__ = "metrics"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    train_loss: Mapped[float | None] = mapped_column(Float, default=None)
    val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    # mean next-token accuracy over the tokens the loss covers (the step's batch / the evaluation)
    train_accuracy: Mapped[float | None] = mapped_column(Float, default=None)
    val_accuracy: Mapped[float | None] = mapped_column(Float, default=None)
    lr: Mapped[float | None] = mapped_column(Float, default=None)
    grad_norm: Mapped[float | None] = mapped_column(Float, default=None)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, default=None)
    tokens_seen: Mapped[int | None] = mapped_column(BigInteger, default=None)
    peak_memory_bytes: Mapped[float | None] = mapped_column(Float, default=None)
    # the registry's system metrics, sampled by the worker on each metrics flush (worker.system_metrics)
    cpu_percent: Mapped[float | None] = mapped_column(Float, default=None)
    rss_bytes: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_utilization: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_memory_bytes: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Event(Base):
    """Lifecycle messages (status changes, warnings). Autoincrement id orders them for SSE."""

    __tablename__ = "events"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, default=lambda: new_id("ftevent"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    level: Mapped[str] = mapped_column(String(8), default="info")  # info | warn | error (OpenAI's)
    type: Mapped[str] = mapped_column(String(16), default="message")
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    """A trainer checkpoint folder stored as a tar blob of its weights, tokenizer, config and state,
    and (the job's newest only: what a resume needs) its optimizer.safetensors as a second blob.
    `model_id` is the id users see."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ftckpt"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    owner_id: Mapped[str] = mapped_column(String(64), index=True)
    step: Mapped[int] = mapped_column(Integer)
    model_id: Mapped[str] = mapped_column(String(200), unique=True)
    blob_id: Mapped[str] = mapped_column(ForeignKey("blobs.id"))
    optimizer_blob_id: Mapped[str | None] = mapped_column(ForeignKey("blobs.id"), default=None)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    is_final: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Export(Base):
    """A model converted for a consumer. Rows of `export_formats` are written `ready` by the worker
    that trained the job; any other (model, format) is inserted `preparing` by the API and turned
    `ready` (or `failed`, with `error`) by a worker's export task. `blob_id` is set once ready."""

    __tablename__ = "exports"
    __table_args__ = (UniqueConstraint("model_id", "format", name="uq_exports_model_format"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("export"))
    model_id: Mapped[str] = mapped_column(String(200), index=True)
    owner_id: Mapped[str | None] = mapped_column(String(64), default=None)
    format: Mapped[str] = mapped_column(
        String(16)
    )  # a trainer.config.export_formats name, `-<dtype>` unless f32
    status: Mapped[str] = mapped_column(String(16), default="ready")  # preparing | ready | failed
    blob_id: Mapped[str | None] = mapped_column(ForeignKey("blobs.id"), default=None)
    filename: Mapped[str] = mapped_column(String(300))
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class InferenceRequest(Base):
    """One completion asked of an inference worker: the API inserts it `queued` and sends its id;
    the worker sets `running`, appends the generated text to `output` as it goes (what is there is
    final: a stop sequence's possible prefix is held back), then `done` (or `failed`, `error`).
    `piece_lengths` lists, as "3,1,2,", the lengths of the pieces `output` was appended in (one per
    token that made text final), so the API streams one chunk per piece whatever its poll timing.
    The API relays `output` and deletes the row; a row deleted early tells the worker to stop."""

    __tablename__ = "inference_requests"
    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("infer"))
    owner_id: Mapped[str] = mapped_column(String(64), index=True)
    model_id: Mapped[str] = mapped_column(String(200))
    blob_id: Mapped[str] = mapped_column(String(40))  # the checkpoint blob holding the weights
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)  # prompt, max_tokens, temperature, ...
    # queued|running|done|failed, or unavailable: the blob store was down when the model was loaded;
    # invalid: the request cannot be served as asked (an echoed prompt past the context to score)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    output: Mapped[str] = mapped_column(Text, default="")
    piece_lengths: Mapped[str] = mapped_column(Text, default="")
    # asked for logprobs: one JSON line per reported token (worker/token_logprobs.py), appended with
    # the text it belongs to
    token_logprobs: Mapped[str] = mapped_column(Text, default="")
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    finish_reason: Mapped[str | None] = mapped_column(String(16), default=None)  # stop | length
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # the worker that took it (its node name) and its last heartbeat (worker/inference_heartbeat.py):
    # a heartbeat that stops tells the API the worker died (api/inference_liveness.py)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class DeletedModel(Base):
    """Models a user deleted (a job's final model or a checkpoint id): hidden from /v1/models."""

    __tablename__ = "deleted_models"
    model_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(64))
    deleted_at: Mapped[datetime] = mapped_column(default=utcnow)


class Worker(Base):
    """A worker process as it advertises itself (worker/advertise.py): inserted when it starts,
    `seen_at` refreshed every heartbeat_seconds, deleted when it stops; a row not seen for
    lease_seconds is a worker that died and is deleted by the next one to refresh. For the
    dashboard and `GET /v1/workers`, and for placing jobs of `device: auto` (api/placement.py);
    admission limits read settings (api/job_limits.py)."""

    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(200), primary_key=True)  # its Celery node name
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)  # a job it runs has lease_owner "<host>:<pid>:..."
    queues: Mapped[list[str]] = mapped_column(JSON, default=list)  # broker queues it consumes
    device_kind: Mapped[str] = mapped_column(String(8))  # cpu | cuda
    devices: Mapped[int] = mapped_column(Integer)  # the most one job runs on here
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)  # per device
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)

    @classmethod
    def alive(cls, lease_seconds: float) -> ColumnElement[bool]:
        """The rows of live workers: seen within `lease_seconds` (GET /v1/workers lists these)."""
        return cls.seen_at >= utcnow() - timedelta(seconds=lease_seconds)
