"""On-demand exports (task `fromscratch.export_model`, the `inference` queue): the API inserted an
`Export` row `preparing` for a (model, format, dtype) that was asked for and not stored yet;
`run_export` makes the file and turns the row `ready` (with its blob) or `failed` (with `error`,
`<code>: <message>` as core.exports encodes it).

Steps: read the row (gone or no longer preparing: a duplicate or replayed message, nothing to do);
find the checkpoint whose weights the model id names (as api.queries.find_model does); download and
extract it into a scratch folder under `work_dir/exports`; convert it with trainer.export.export
(a folder format such as hf: the folder, then one uncompressed tar of it); store the blob; then,
under the owner's quota lock and the row's lock, check the storage quota (over: the blob is
deleted, the row failed with `quota_exceeded`) and mark the row ready. A row deleted meanwhile (its model was deleted) or
already finished by another worker (a stale row sent again) gets nothing: the blob is deleted.
The scratch folder is removed in every case.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.blobstore import BlobStore
from core.exports import FAILED, PREPARING, READY, encode_error, export_folder_name
from core.models import Checkpoint, DeletedModel, Export, Job
from core.quotas import lock_owner, stored_bytes
from core.settings import Settings
from core.status import JobStatus
from trainer.config.export_formats import DEFAULT_DTYPE, DTYPES, FORMAT_NAMES, export_format
from worker.checkpoint_files import extract_checkpoint_tar, tar_folder
from worker.process import resources

log = logging.getLogger(__name__)


class _Failed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def run_export(export_id: str, settings: Settings) -> None:
    res = resources(settings)
    sf, store = res.session_factory, res.store
    with sf() as session:
        row = session.get(Export, export_id)
        if row is None or row.status != PREPARING:
            return
        model_id, key, filename, owner_id = row.model_id, row.format, row.filename, row.owner_id
        blob_id = checkpoint_blob(session, owner_id, model_id)
    fmt, _, dtype = key.partition("-")
    dtype = dtype or DEFAULT_DTYPE
    root = settings.work_path / "exports"
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="export-", dir=root))
    try:
        if fmt not in FORMAT_NAMES or dtype not in DTYPES:
            raise _Failed("internal_error", f"unknown export format {key!r}")
        if blob_id is None:
            raise _Failed("export_failed", f"Model {model_id} has no stored weights to export.")
        path = _convert(store, blob_id, model_id, fmt, dtype, scratch / filename)
        _store(sf, store, export_id, owner_id, path, settings.max_stored_bytes_per_key)
        log.info("export %s: %s of %s is ready", export_id, key, model_id)
    except _Failed as failed:
        _fail(sf, export_id, failed.code, failed.message)
    except Exception as exc:
        log.exception("export %s (%s of %s) failed", export_id, key, model_id)
        _fail(sf, export_id, "internal_error", f"The export failed on the server ({type(exc).__name__}).")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def checkpoint_blob(session: Session, owner_id: str | None, model_id: str) -> str | None:
    """The checkpoint blob holding model `model_id`'s weights (a finished job's final model: its
    final checkpoint, else its newest; a checkpoint model: that checkpoint), None if none is stored."""
    owner = [] if owner_id is None else [DeletedModel.owner_id == owner_id]
    if session.scalar(select(DeletedModel.model_id).where(DeletedModel.model_id == model_id, *owner)):
        return None
    job_owner = [] if owner_id is None else [Job.owner_id == owner_id]
    job = session.scalar(
        select(Job).where(Job.fine_tuned_model == model_id, Job.status == JobStatus.SUCCEEDED, *job_owner)
    )
    query = select(Checkpoint.blob_id).where(Checkpoint.model_id == model_id)
    if job is not None:
        found = session.scalar(query) or session.scalar(
            select(Checkpoint.blob_id)
            .where(Checkpoint.job_id == job.id)
            .order_by(Checkpoint.is_final.desc(), Checkpoint.step.desc())
            .limit(1)
        )
        return found
    ckpt_owner = [] if owner_id is None else [Checkpoint.owner_id == owner_id]
    return session.scalar(query.where(*ckpt_owner))


def _convert(store: BlobStore, blob_id: str, model_id: str, fmt: str, dtype: str, out: Path) -> Path:
    """The checkpoint blob converted to `out` (a folder format: a tar of the folder)."""
    from trainer.export import ExportError, export

    tar_path = store.read_to_path(blob_id, out.parent / "checkpoint.tar")
    ckpt_dir = extract_checkpoint_tar(tar_path, out.parent / "checkpoint")
    tar_path.unlink()
    try:
        spec = export_format(fmt)
        if spec.is_folder:
            folder = export(ckpt_dir, fmt, out.parent / spec.path, dtype, name=model_id)
            return tar_folder(Path(folder), out, arcname=export_folder_name(model_id, fmt, dtype))
        return Path(export(ckpt_dir, fmt, out, dtype, name=model_id))  # the id users know it by
    except ExportError as e:
        raise _Failed("export_failed", f"Cannot export {model_id} as {fmt} ({dtype}): {e}") from e


def _store(
    sf: sessionmaker[Session], store: BlobStore, export_id: str, owner_id: str | None, path: Path, limit: int
) -> None:
    with sf() as session:
        blob = store.put_file(path, session)
        if owner_id is not None:
            lock_owner(session, owner_id)
        row = session.scalar(select(Export).where(Export.id == export_id).with_for_update())
        blob_id = blob.id
        if row is None or row.status != PREPARING or row.blob_id is not None:
            # deleted with its model, or finished by another worker (a stale row sent again)
            session.rollback()
            store.delete(blob_id, session)
            session.commit()
            return
        used = stored_bytes(session, owner_id) if owner_id is not None else 0
        size = blob.size
        if used + size > limit:
            session.rollback()
            store.delete(blob_id, session)
            session.commit()
            raise _Failed(
                "quota_exceeded",
                f"this key's files, checkpoints and exports use {used} bytes; this export of {size} "
                "bytes would take it past its storage quota. Delete files (DELETE /v1/files/ID) or models "
                "(DELETE /v1/models/ID) first",
            )
        row.blob_id, row.status, row.error = blob_id, READY, None
        session.commit()


def _fail(sf: sessionmaker[Session], export_id: str, code: str, message: str) -> None:
    with sf() as session:
        row = session.scalar(select(Export).where(Export.id == export_id).with_for_update())
        if row is None or row.status != PREPARING:
            return
        row.status, row.error = FAILED, encode_error(code, message)
        session.commit()
