"""The exports a job asked for (`export_formats`), made by the training worker while it finishes the
job, so the first download of them answers at once (api/exports.py serves a `ready` row).

`store_final_exports` runs in JobEnding.succeed before the job is marked succeeded. It exports the
final checkpoint folder on this worker's disk (the same folder stored as the final checkpoint),
in FINAL_DTYPE (f32), with trainer.export.final, and stores each file as a blob with an `Export`
row: status ready, keyed by the job's final model id (`fine_tuned_model`), its `format` and filename
as core.exports names them (a folder format such as hf: a tar of the folder), `owner_id` the job's
owner.

- Idempotent: an attempt retried after a crash makes its exports again and replaces the rows the
  earlier attempt left (the unique constraint (model_id, format) holds one row each), so the
  stored files always match the final checkpoint of the attempt that succeeded.
- Quota: the files count toward `max_stored_bytes_per_key`. One that would take the owner past it
  is not stored: a `warn` event says so, the job still succeeds, and a download of that format
  goes the on-demand way. Until the job has succeeded core.quotas does not count its model's
  exports yet, so they are added here.
- A format this model cannot be exported as (trainer ExportError), or an export that breaks, is a
  `warn` event too: the trained model stands. A lost lease or a database outage is raised (the
  job's run handles those as for any other step).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.exports import READY, export_filename, export_folder_name, export_key
from core.jobstates import add_event
from core.models import Blob, Export
from core.naming import final_model_id
from core.quotas import lock_owner, stored_bytes
from trainer.config import TrainConfig
from trainer.config.export_formats import FINAL_DTYPE, export_format
from worker.checkpoint_files import tar_folder
from worker.lease import LeaseLost, lock_held_job

if TYPE_CHECKING:
    from core.blobstore import BlobStore
    from core.settings import Settings
    from worker.db_retry import DbRetry
    from worker.job_inputs import JobSnapshot

log = logging.getLogger(__name__)


class FinishingJob(Protocol):
    """What of worker.job_ending.JobEnding this step uses."""

    job_id: str
    worker_id: str
    settings: Settings
    sf: sessionmaker[Session]
    store: BlobStore
    job_dir: Path
    db: DbRetry


def store_final_exports(run: FinishingJob, snapshot: JobSnapshot, final: Path) -> None:
    """Export `final` (the final checkpoint folder) as the job's export_formats and store them."""
    formats = TrainConfig.from_dict(snapshot.train_config).export_formats
    if not formats:
        return
    model_id = final_model_id(snapshot.naming_job)
    scratch = run.job_dir / "final-exports"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        for fmt, written in _export(run, final, formats, scratch).items():
            if isinstance(written, str):
                _warn(run, f"The {fmt} export was not made: {written}", {"export": fmt})
                continue
            path = written
            if export_format(fmt).is_folder:
                name = export_filename(model_id, fmt, FINAL_DTYPE)
                arcname = export_folder_name(model_id, fmt, FINAL_DTYPE)
                path = tar_folder(written, scratch / name, arcname=arcname)
            _store(run, snapshot.owner_id, model_id, fmt, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _export(run: FinishingJob, final: Path, formats: Sequence[str], scratch: Path) -> dict[str, Path | str]:
    """{format: its file (hf: folder), or why there is none}."""
    from trainer.export import ExportError
    from trainer.export.final import export_final

    try:
        results = export_final(final, formats, scratch)
    except Exception as exc:  # a bug in an exporter must not fail a trained job
        log.exception("job %s: the final exports failed", run.job_id)
        return {fmt: f"{type(exc).__name__}: {exc}" for fmt in formats}
    return {fmt: str(r) if isinstance(r, ExportError) else r for fmt, r in results.items()}


def _store(run: FinishingJob, owner_id: str, model_id: str, fmt: str, path: Path) -> None:
    key, filename = export_key(fmt, FINAL_DTYPE), export_filename(model_id, fmt, FINAL_DTYPE)
    limit = run.settings.max_stored_bytes_per_key

    def write() -> tuple[list[str], int | None]:
        """(blobs to delete after the commit, the size refused by the quota or None)."""
        with run.sf() as session:
            with open(path, "rb") as fh:
                blob = run.store.put(fh, session)
            try:
                job = lock_held_job(session, run.job_id, run.worker_id)
            except LeaseLost:
                _discard(session, run.store, blob.id)
                raise
            lock_owner(session, owner_id)
            row = session.scalar(select(Export).where(Export.model_id == model_id, Export.format == key))
            used = stored_bytes(session, owner_id)
            if job.fine_tuned_model != model_id:  # not counted by core.quotas until the job succeeded
                used += _exports_bytes(session, model_id)
            if row is not None and row.blob_id is not None:
                used -= run.store.info(row.blob_id).size  # replaced below
            blob_id, size = blob.id, blob.size
            if used + size > limit:
                _discard(session, run.store, blob_id)
                return [], size
            doomed = [row.blob_id] if row is not None and row.blob_id is not None else []
            if row is None:
                row = Export(model_id=model_id, format=key, owner_id=owner_id, filename=filename)
                session.add(row)
            row.blob_id, row.status, row.filename, row.error, row.owner_id = (
                blob_id,
                READY,
                filename,
                None,
                owner_id,
            )
            session.commit()
            return doomed, None

    doomed, refused = run.db.call(write)
    for blob_id in doomed:
        _delete_blob(run, blob_id)
    if refused is not None:
        _warn(
            run,
            f"The {fmt} export ({refused} bytes) was not stored: it would take this key past its storage "
            f"quota (max_stored_bytes_per_key={limit}). It is made on first download instead, if there "
            "is room then.",
            {"export": fmt, "quota": "max_stored_bytes_per_key"},
        )
    else:
        log.info("job %s: stored the %s export of %s", run.job_id, fmt, model_id)


def _exports_bytes(session: Session, model_id: str) -> int:
    q = (
        select(func.coalesce(func.sum(Blob.size), 0))
        .select_from(Export)
        .join(Blob, Blob.id == Export.blob_id)
        .where(Export.model_id == model_id)
    )
    return int(session.scalar(q) or 0)


def _discard(session: Session, store: BlobStore, blob_id: str) -> None:
    """Undo a blob written in `session`'s transaction (its row was not committed)."""
    session.rollback()
    store.delete(blob_id, session)
    session.commit()


def _delete_blob(run: FinishingJob, blob_id: str) -> None:
    try:
        with run.sf() as session:
            run.store.delete(blob_id, session)
            session.commit()
    except Exception:  # the reaper's blob gc gets another chance; never fail the job over this
        log.warning("job %s: could not delete replaced export blob %s", run.job_id, blob_id, exc_info=True)


def _warn(run: FinishingJob, message: str, data: dict[str, str]) -> None:
    log.warning("job %s: %s", run.job_id, message)

    def write() -> None:
        with run.sf() as session:
            add_event(session, run.job_id, message, level="warn", data=data)
            session.commit()

    run.db.call(write)
