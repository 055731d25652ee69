"""Model downloads: `GET /v1/models/{id}/content?format=FORMAT[&dtype=DTYPE]`, FORMAT one of
core.exports.DOWNLOAD_FORMATS (the formats of trainer.config.export_formats, then `checkpoint`),
DTYPE one of its DTYPES; GET /v1/fine_tuning/export_formats serves both lists.

Nothing is converted in the API process (it never imports torch): workers make every export.

- `checkpoint`: the stored checkpoint blob itself, an uncompressed tar of the trainer's checkpoint
  folder (weights as safetensors + JSON configs, tokenizer, training progress); the optimizer's state
  is a blob of its own that only the service's resumes read (worker/checkpoint_store.py), not sent.
- an export format (`gguf`, `hf`: one uncompressed tar of the Hugging Face folder, `onnx`): an
  `Export` row per (model, format, dtype) (`format` is core.exports.export_key: `gguf`, `hf-f16`, ...):
  - `ready` (made by the training worker at the end of the job for its `export_formats`, or
    earlier on demand): 200, the file.
  - none: the owner's storage quota is checked (429 when already full), a row `preparing` is
    committed and its id sent to the inference queue (worker.exports.run_export makes the file):
    202 with `Retry-After` and an `ExportPreparing` body. Ask again after that many seconds.
    Concurrent first requests: the unique constraint (model_id, format) lets one insert; the
    others answer 202 for the row it made. A broker that cannot be reached: the row is removed
    again and the answer is 503 `broker_unavailable`.
  - `preparing`: 202 again. A row preparing for longer than `export_stale_seconds` (its worker
    died) is sent again (its `updated_at` touched: one request of many wins that).
  - `failed`: the worker's error (`export_failed` 400, `quota_exceeded` 429, else 500); the row is
    deleted, so the next request tries again.
- Deleting a model deletes its exports in any status (a worker still making one finds its row
  gone and deletes its file).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from celery import Celery
from pydantic import BaseModel, Field
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.errors import APIError
from api.queries import ModelRef
from api.quotas import STORAGE_RETRY_AFTER_SECONDS, quota_exceeded, storage_exceeded
from core.blobstore import BlobStore
from core.broker import EXPORT_TASK, send_to_inference_worker
from core.exports import (
    CHECKPOINT,
    FAILED,
    PREPARING,
    READY,
    DownloadFormat,
    decode_error,
    export_filename,
    export_key,
    media_type,
    safe_name,
)
from core.models import Export, utcnow
from core.quotas import stored_bytes
from core.settings import Settings
from trainer.config.export_formats import DTYPE_NAMES, FORMAT_NAMES, ExportDtype

RETRY_AFTER_SECONDS = 2  # a tiny model exports in about a second; larger ones take a few polls
log = logging.getLogger(__name__)


@dataclass
class Download:
    blob_id: str
    filename: str
    size: int
    media_type: str


class ExportPreparing(BaseModel):
    """The 202 body while a worker makes the export: ask again after `Retry-After` seconds."""

    object: Literal["model.export"] = "model.export"
    id: str = Field(description="the export's id")
    model: str
    format: str = Field(description=f"one of {', '.join(FORMAT_NAMES)}")
    dtype: str = Field(description=f"one of {', '.join(DTYPE_NAMES)}")
    status: Literal["preparing"] = "preparing"
    message: str


def find_download(
    session: Session,
    ref: ModelRef,
    fmt: DownloadFormat,
    dtype: ExportDtype,
    *,
    store: BlobStore,
    celery: Celery,
    settings: Settings,
) -> Download | ExportPreparing:
    """The file to stream, or the export a worker is making (sent to one when needed)."""
    if ref.checkpoint is None:
        raise APIError(
            404, f"Model {ref.id!r} has no stored weights to download.", param="model", code="model_not_found"
        )
    if fmt == CHECKPOINT.name:
        info = store.info(ref.checkpoint.blob_id)
        filename = f"{safe_name(ref.id)}.{CHECKPOINT.extension}"
        return Download(ref.checkpoint.blob_id, filename, info.size, media_type(filename))
    key = export_key(fmt, dtype)
    for _ in range(3):  # a row that vanished between two reads (deleted as failed, or raced): again
        row = session.scalar(select(Export).where(Export.model_id == ref.id, Export.format == key))
        if row is None:
            row = _insert(session, ref, fmt, dtype, settings.max_stored_bytes_per_key)
            if row is None:
                continue  # a concurrent request inserted it first: answer for theirs
            answer = _preparing(row.id, ref.id, fmt, dtype)
            _send(session, celery, row.id)
            return answer
        if row.status == READY:
            if row.blob_id is None:  # a ready row without its file cannot serve: make it again
                session.execute(delete(Export).where(Export.id == row.id, Export.blob_id.is_(None)))
                session.commit()
                continue
            size = store.info(row.blob_id).size
            return Download(row.blob_id, row.filename, size, media_type(row.filename))
        if row.status == FAILED:
            _answer_failure(session, row, settings)
        answer = _preparing(row.id, ref.id, fmt, dtype)
        if utcnow() - row.updated_at > timedelta(seconds=settings.export_stale_seconds):
            _send_again(session, celery, row)
        return answer
    raise APIError(503, "The export changed while it was looked up; try again.", code="export_busy")


def _preparing(export_id: str, model_id: str, fmt: str, dtype: str) -> ExportPreparing:
    return ExportPreparing(
        id=export_id,
        model=model_id,
        format=fmt,
        dtype=dtype,
        message=f"A worker is preparing the {fmt} ({dtype}) export of this model: ask again in "
        f"{RETRY_AFTER_SECONDS} s (Retry-After).",
    )


def _insert(session: Session, ref: ModelRef, fmt: str, dtype: str, limit: int) -> Export | None:
    """A new `preparing` row, committed; None when a concurrent request inserted it first."""
    owner = ref.job.owner_id
    used = stored_bytes(session, owner)
    if used >= limit:  # refuse before a worker spends time on it (the worker checks the size too)
        raise storage_exceeded(limit, used, None, "a new export", "format")
    row = Export(
        model_id=ref.id,
        format=export_key(fmt, dtype),
        owner_id=owner,
        status=PREPARING,
        filename=export_filename(ref.id, fmt, dtype),
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return None
    return row


def _send(session: Session, celery: Celery, export_id: str) -> None:
    """The row's id to the inference queue; on a broker failure the row goes again (503)."""
    try:
        send_to_inference_worker(celery, EXPORT_TASK, export_id)
    except Exception as e:  # any broker failure
        log.warning("could not send export %s to a worker: %s", export_id, type(e).__name__)
        session.rollback()
        session.execute(delete(Export).where(Export.id == export_id, Export.status == PREPARING))
        session.commit()
        raise APIError(
            503,
            "The export could not be queued: the broker is unreachable. Nothing "
            "was kept; try again later (GET /readyz shows when the service is ready).",
            code="broker_unavailable",
        ) from e


def _send_again(session: Session, celery: Celery, row: Export) -> None:
    """A preparing row whose worker died: touch it (compare-and-set on updated_at, so one of many
    concurrent requests wins) and send it again."""
    export_id = row.id
    won = session.execute(
        update(Export)
        .where(Export.id == export_id, Export.status == PREPARING, Export.updated_at == row.updated_at)
        .values(updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()
    if won.rowcount == 1:  # type: ignore[attr-defined]
        log.info("export %s was preparing for too long: sent again", export_id)
        _send(session, celery, export_id)


def _answer_failure(session: Session, row: Export, settings: Settings) -> None:
    """Raise the failed row's error, after deleting the row (the next request tries again)."""
    code, message = decode_error(row.error)
    session.execute(delete(Export).where(Export.id == row.id, Export.status == FAILED))
    session.commit()
    if code == "export_failed":
        raise APIError(400, message, param="format", code="export_failed")
    if code == "quota_exceeded":
        raise quota_exceeded(
            "max_stored_bytes_per_key",
            settings.max_stored_bytes_per_key,
            message,
            STORAGE_RETRY_AFTER_SECONDS,
            "format",
        )
    raise APIError(500, f"The export failed on the server: {message}", code="internal_error")


def delete_exports(session: Session, store: BlobStore, model_id: str) -> int:
    """Delete the model's exports in any status (and the files of the ready ones). No commit."""
    rows = session.scalars(select(Export).where(Export.model_id == model_id)).all()
    for row in rows:
        blob_id = row.blob_id
        session.delete(row)
        session.flush()
        if blob_id is not None:
            store.delete(blob_id, session)
    return len(rows)
