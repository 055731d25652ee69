"""Model downloads: `GET /v1/models/{id}/content?format=gguf|hf|onnx|checkpoint[&dtype=f32|f16|q8_0]`.

- `checkpoint`: the stored checkpoint blob itself, an uncompressed tar of the trainer's checkpoint
  folder (weights as safetensors + JSON configs, tokenizer, optimizer state).
- `gguf`, `onnx`, `hf`: produced on the first request for (model, format, dtype) and kept. The
  checkpoint blob is extracted to a scratch folder under `work_dir/exports`, converted by
  `trainer.export.export` (in the request's worker thread, never on the event loop), and the
  result (gguf/onnx: the file; hf: one uncompressed tar of the Hugging Face folder) goes into the
  blob store with an `Export` row. Later requests stream the stored blob.
- Concurrency: requests for the same export in one process wait on one lock; across processes the
  unique constraint (model_id, format) decides: the loser deletes its own blob and serves the
  winner's. An `Export.format` is the format for dtype f32 and `<format>-<dtype>` otherwise.
- Exports count toward the owner's `max_stored_bytes_per_key`: a new export is refused (429
  `quota_exceeded`) when the owner is already at the quota, or when the produced file would take
  it past (then the file is deleted again, under the owner's quota lock, so nothing is kept).
"""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.errors import APIError
from api.queries import ModelRef
from api.quotas import check_storage, storage_exceeded
from core.blobstore import BlobStore
from core.models import Export
from core.quotas import stored_bytes

ExportFormat = Literal["gguf", "hf", "onnx", "checkpoint"]
ExportDtype = Literal["f32", "f16", "q8_0"]
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@dataclass
class Download:
    blob_id: str
    filename: str
    size: int
    media_type: str


def safe_name(model_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model_id).strip("-") or "model"


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def extract_checkpoint_tar(tar_path: Path, dest: Path) -> Path:
    """Extract a checkpoint tar (folder at its root) into `dest`; returns the checkpoint folder."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tf:
        tf.extractall(dest, filter="data")
    for config in sorted(dest.rglob("config.json")):
        if (config.parent / "model.safetensors").exists():
            return config.parent
    raise APIError(
        500,
        "The stored checkpoint is not a checkpoint folder (no config.json + model.safetensors).",
        code="checkpoint_unreadable",
    )


def tar_folder(folder: Path, out: Path, arcname: str) -> Path:
    with tarfile.open(out, "w") as tf:
        tf.add(folder, arcname=arcname)
    return out


def prepare_download(
    ref: ModelRef,
    fmt: ExportFormat,
    dtype: ExportDtype,
    *,
    store: BlobStore,
    factory: sessionmaker[Session],
    work_dir: Path,
    max_stored_bytes: int,
) -> Download:
    if ref.checkpoint is None:
        raise APIError(
            404, f"Model {ref.id!r} has no stored weights to download.", param="model", code="model_not_found"
        )
    name = safe_name(ref.id)
    if fmt == "checkpoint":
        info = store.info(ref.checkpoint.blob_id)
        return Download(ref.checkpoint.blob_id, f"{name}.tar", info.size, "application/x-tar")
    key = fmt if dtype == "f32" else f"{fmt}-{dtype}"
    with _lock_for(f"{ref.id}\0{key}"):
        with factory() as session:
            row = session.scalar(select(Export).where(Export.model_id == ref.id, Export.format == key))
            if row is None:
                used = stored_bytes(session, ref.job.owner_id)
                if used >= max_stored_bytes:  # refuse before the (slow) conversion
                    raise storage_exceeded(max_stored_bytes, used, None, "a new export", "format")
                session.commit()  # no transaction open during the conversion
                row = _produce(
                    ref,
                    fmt,
                    dtype,
                    key,
                    name,
                    store=store,
                    session=session,
                    work_dir=work_dir,
                    max_stored_bytes=max_stored_bytes,
                )
            info = store.info(row.blob_id)
            media = "application/x-tar" if row.filename.endswith(".tar") else "application/octet-stream"
            return Download(row.blob_id, row.filename, info.size, media)


def _produce(
    ref: ModelRef,
    fmt: str,
    dtype: str,
    key: str,
    name: str,
    *,
    store: BlobStore,
    session: Session,
    work_dir: Path,
    max_stored_bytes: int,
) -> Export:
    from trainer.export import ExportError, export

    assert ref.checkpoint is not None
    scratch_root = work_dir / "exports"
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="export-", dir=scratch_root))
    try:
        tar_path = store.read_to_path(ref.checkpoint.blob_id, scratch / "checkpoint.tar")
        ckpt_dir = extract_checkpoint_tar(tar_path, scratch / "checkpoint")
        suffix = "" if dtype == "f32" else f"-{dtype}"
        try:
            if fmt == "hf":
                folder = export(ckpt_dir, "hf", scratch / "hf", dtype)
                filename = f"{name}-hf{suffix}.tar"
                out = tar_folder(Path(folder), scratch / filename, arcname=f"{name}-hf{suffix}")
            else:
                filename = f"{name}{suffix}.{fmt}"
                out = Path(export(ckpt_dir, fmt, scratch / filename, dtype))
        except ExportError as e:
            raise APIError(
                400, f"Cannot export {ref.id} as {fmt} ({dtype}): {e}", param="format", code="export_failed"
            ) from e
        blob = store.put_file(out, session)
        try:
            check_storage(session, ref.job.owner_id, max_stored_bytes, blob.size, "this export", "format")
        except APIError:
            session.rollback()
            store.delete(blob.id, session)
            session.commit()
            raise
        row = Export(model_id=ref.id, format=key, blob_id=blob.id, filename=filename)
        session.add(row)
        try:
            session.commit()
        except IntegrityError:  # another process made the same export first: use theirs
            session.rollback()
            store.delete(blob.id, session)
            session.commit()
            existing = session.scalar(select(Export).where(Export.model_id == ref.id, Export.format == key))
            if existing is None:
                raise
            return existing
        return row
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def delete_exports(session: Session, store: BlobStore, model_id: str) -> int:
    rows = session.scalars(select(Export).where(Export.model_id == model_id)).all()
    for row in rows:
        blob_id = row.blob_id
        session.delete(row)
        session.flush()
        store.delete(blob_id, session)
    return len(rows)
