"""The trainer's callbacks as the service needs them: metrics and progress into the database,
checkpoints into the blob store, cancel/pause/shutdown/lost-lease into `should_stop`.

Everything that writes is conditional on this worker still holding the job's lease
(`UPDATE jobs ... WHERE id = ? AND lease_owner = ?`): a worker whose lease expired (it was too slow
to heartbeat, or the reaper gave its job to another worker) stops writing at once and stops training
at the next step.

Metrics are buffered and written in one transaction every `metrics_flush_seconds` (or every
`FLUSH_ROWS` rows), together with the job's denormalised progress columns, so a 10 000-step run
costs a few hundred small transactions, not 10 000. Rows are upserted by (job_id, step); an
evaluation at a step fills that row's `val_loss`.

Stored checkpoints are rotated like the trainer's local ones: the newest `keep_checkpoints` step
checkpoints of a job are kept (plus the final one); older rows and their blobs are deleted unless a
download (an Export row) was made from them.
"""

from __future__ import annotations

import logging
import math
import os
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.models import Checkpoint, Export, Job, Metric, utcnow
from trainer.loop import Callbacks

log = logging.getLogger(__name__)

FLUSH_ROWS = 50  # flush the metric buffer when it holds this many steps, whatever the time
STOP_CHECK_SECONDS = 0.5  # how often should_stop() reads cancel/pause requests from the database
METRIC_COLUMNS = ("train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "tokens_seen")

# why the run is being stopped (the first reason seen wins)
StopCause = Literal["cancel", "pause", "shutdown", "lease_lost"]


class LeaseLost(Exception):
    """This worker no longer holds the job's lease: another worker may own it now."""


def _insert(session: Session) -> Any:
    """The dialect's INSERT with ON CONFLICT (PostgreSQL and SQLite both have it)."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - only the two supported databases
        raise RuntimeError(f"unsupported database dialect {name!r}")
    return insert


def upsert_metrics(session: Session, job_id: str, rows: dict[int, dict[str, Any]]) -> None:
    """Insert or update Metric rows by (job_id, step); None never overwrites a stored value."""
    if not rows:
        return
    now = utcnow()
    values = [
        {"job_id": job_id, "step": step, "created_at": now, **{c: row.get(c) for c in METRIC_COLUMNS}}
        for step, row in sorted(rows.items())
    ]
    stmt = _insert(session)(Metric).values(values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Metric.job_id, Metric.step],
        set_={c: func.coalesce(getattr(stmt.excluded, c), getattr(Metric, c)) for c in METRIC_COLUMNS},
    )
    session.execute(stmt)


def lock_held_job(session: Session, job_id: str, worker_id: str) -> Job:
    """The job row, locked for this transaction, if this worker still holds its lease."""
    job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
    if job is None or job.lease_owner != worker_id:
        raise LeaseLost(job_id)
    return job


def tar_folder(folder: Path, out: Path) -> Path:
    """An uncompressed tar of `folder` with the folder's name at the root (the stored checkpoint form)."""
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    with tarfile.open(tmp, "w") as tar:
        tar.add(folder, arcname=folder.name)
    os.replace(tmp, out)
    return out


def store_checkpoint(
    session_factory: sessionmaker[Session],
    store: Any,
    *,
    job_id: str,
    worker_id: str,
    step: int,
    folder: Path,
    model_id: str,
    metrics: dict[str, Any],
    is_final: bool,
    keep: int | None,
    scratch: Path,
    extra: Callable[[Session, Job], None] | None = None,
) -> str:
    """Tar `folder`, put it into the blob store and record the Checkpoint row (replacing an earlier
    row for the same step), all in one transaction that first checks the lease. `extra(session, job)`
    runs in that transaction too (the runner finishes the job there). Returns the checkpoint id."""
    tar_path = tar_folder(folder, scratch / f"{folder.name}-{step}.tar")
    try:
        with session_factory() as session:
            # Upload first, then lock the job row only for the short bookkeeping transaction (a long
            # upload must not block heartbeats or the API's cancel request behind a row lock).
            with open(tar_path, "rb") as fh:
                blob = store.put(fh, session)
            try:
                job = lock_held_job(session, job_id, worker_id)
            except LeaseLost:
                session.rollback()
                _delete_blob(session_factory, store, blob.id)
                raise
            old = session.execute(
                select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
            ).scalar_one_or_none()
            old_blob = None
            if old is not None:
                old_blob, old.blob_id = old.blob_id, blob.id
                old.metrics, old.is_final, old.created_at = metrics, is_final or old.is_final, utcnow()
                ckpt = old
            else:
                ckpt = Checkpoint(
                    job_id=job_id,
                    owner_id=job.owner_id,
                    step=step,
                    model_id=model_id,
                    blob_id=blob.id,
                    metrics=metrics,
                    is_final=is_final,
                )
                session.add(ckpt)
            session.flush()
            doomed = [old_blob] if old_blob else []
            if keep:
                doomed += _rotate(session, job_id, keep)
            if extra is not None:
                extra(session, job)
            session.commit()
            ckpt_id = ckpt.id
        for blob_id in doomed:
            _delete_blob(session_factory, store, blob_id)
        return ckpt_id
    finally:
        tar_path.unlink(missing_ok=True)


def _rotate(session: Session, job_id: str, keep: int) -> list[str]:
    """Delete all but the newest `keep` non-final checkpoint rows of the job (never one a download
    was exported from). Returns the blob ids to delete once the transaction committed."""
    rows = (
        session.execute(
            select(Checkpoint)
            .where(Checkpoint.job_id == job_id, Checkpoint.is_final.is_(False))
            .order_by(Checkpoint.step.desc())
        )
        .scalars()
        .all()
    )
    exported = (
        set(
            session.execute(
                select(Export.model_id).where(Export.model_id.in_([c.model_id for c in rows]))
            ).scalars()
        )
        if rows
        else set()
    )
    doomed = []
    for ckpt in rows[keep:]:
        if ckpt.model_id in exported:
            continue
        doomed.append(ckpt.blob_id)
        session.delete(ckpt)
    return doomed


def _delete_blob(session_factory: sessionmaker[Session], store: Any, blob_id: str) -> None:
    try:
        with session_factory() as session:
            store.delete(blob_id, session)
            session.commit()
    except Exception:  # the reaper's blob gc gets another chance; never fail training over this
        log.warning("could not delete blob %s", blob_id, exc_info=True)


class ServiceCallbacks(Callbacks):
    """Callbacks for one claimed job. Thread-safety: the trainer calls everything on its thread;
    the heartbeat thread only sets `lease_lost` (an Event) and the worker's signal handler only sets
    `shutdown`."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        store: Any,
        *,
        job_id: str,
        worker_id: str,
        checkpoint_model_id: Callable[[int], str],
        scratch: Path,
        flush_seconds: float = 1.0,
        keep_checkpoints: int | None = 3,
        lease_lost: threading.Event | None = None,
        shutdown: threading.Event | None = None,
        flush_rows: int = FLUSH_ROWS,
        stop_check_seconds: float = STOP_CHECK_SECONDS,
    ):
        self.session_factory = session_factory
        self.store = store
        self.job_id = job_id
        self.worker_id = worker_id
        self.checkpoint_model_id = checkpoint_model_id
        self.scratch = scratch
        self.flush_seconds = flush_seconds
        self.flush_rows = flush_rows
        self.keep_checkpoints = keep_checkpoints
        self.stop_check_seconds = stop_check_seconds
        self.lease_lost = lease_lost or threading.Event()
        self.shutdown = shutdown or threading.Event()
        self.cause: StopCause | None = None
        self.buffer: dict[int, dict[str, Any]] = {}
        self.progress: dict[str, Any] = {}
        self.last_flush = time.monotonic()
        self.last_check = 0.0
        self.last_train_loss: float | None = None
        self.last_val_loss: float | None = None
        self.stored_steps: list[int] = []
        self.first_step_written = False  # the first loss of a run is written at once (time to first loss)

    # ------------------------------------------------------------------ trainer hooks
    def on_start(self, info: dict[str, Any]) -> None:
        self.progress.update(total_steps=int(info["total_steps"]), step=int(info["start_step"]))
        self.flush()

    def on_step(
        self, step: int, train_loss: float, lr: float, grad_norm: float, tokens_per_s: float, tokens_seen: int
    ) -> None:
        if self.lease_lost.is_set():
            return
        self.buffer.setdefault(step, {}).update(
            train_loss=train_loss,
            lr=lr,
            grad_norm=_finite(grad_norm),
            tokens_per_s=tokens_per_s,
            tokens_seen=tokens_seen,
        )
        self.last_train_loss = train_loss
        self.progress.update(
            step=step, train_loss=train_loss, tokens_per_s=tokens_per_s, trained_tokens=tokens_seen
        )
        self.maybe_flush()

    def on_eval(self, step: int, val_loss: float) -> None:
        if self.lease_lost.is_set():
            return
        val = _finite(val_loss)
        self.buffer.setdefault(step, {})["val_loss"] = val
        self.last_val_loss = val
        self.progress.update(step=max(step, self.progress.get("step", 0)), val_loss=val)
        self.maybe_flush()

    def on_checkpoint(self, step: int, path: Path) -> None:
        # A cancelled job needs no checkpoint; a worker without the lease must not write.
        if self.cause in ("cancel", "lease_lost") or self.lease_lost.is_set():
            return
        try:
            self.flush()
            store_checkpoint(
                self.session_factory,
                self.store,
                job_id=self.job_id,
                worker_id=self.worker_id,
                step=step,
                folder=path,
                model_id=self.checkpoint_model_id(step),
                metrics=self.checkpoint_metrics(step),
                is_final=False,
                keep=self.keep_checkpoints,
                scratch=self.scratch,
            )
            self.stored_steps.append(step)
        except LeaseLost:
            self._lose_lease()

    def should_stop(self) -> Literal["stop", "pause"] | None:
        if self.lease_lost.is_set():
            self._lose_lease()
        if self.cause is None:
            now = time.monotonic()
            if now - self.last_check >= self.stop_check_seconds:
                self.last_check = now
                self._read_requests()
        if self.cause is None and self.shutdown.is_set():
            self.cause = "shutdown"
        if self.cause in ("cancel", "lease_lost"):
            return "stop"
        if self.cause in ("pause", "shutdown"):
            return "pause"  # pause writes (and on_checkpoint stores) a checkpoint of this step
        return None

    # ------------------------------------------------------------------ database
    def checkpoint_metrics(self, step: int) -> dict[str, Any]:
        return {"step": step, "train_loss": self.last_train_loss, "valid_loss": self.last_val_loss}

    def maybe_flush(self) -> None:
        if (
            not self.first_step_written
            or len(self.buffer) >= self.flush_rows
            or time.monotonic() - self.last_flush >= self.flush_seconds
        ):
            self.first_step_written = bool(self.buffer)
            self.flush()

    def flush(self) -> None:
        """Write buffered metrics and the job's progress in one transaction (if the lease holds)."""
        self.last_flush = time.monotonic()
        if self.lease_lost.is_set() or (not self.buffer and not self.progress):
            return
        rows, progress = self.buffer, self.progress
        try:
            with self.session_factory() as session:
                result = session.execute(
                    update(Job)
                    .where(Job.id == self.job_id, Job.lease_owner == self.worker_id)
                    .values(**progress, updated_at=utcnow())
                )
                if result.rowcount == 0:  # type: ignore[attr-defined]
                    session.rollback()
                    self._lose_lease()
                    return
                upsert_metrics(session, self.job_id, rows)
                session.commit()
        except Exception:
            # Keep the rows for the next flush: a database hiccup must not lose the loss curve.
            log.warning("metrics flush for %s failed; will retry", self.job_id, exc_info=True)
            return
        self.buffer, self.progress = {}, {}

    def _read_requests(self) -> None:
        try:
            with self.session_factory() as session:
                row = session.execute(
                    select(Job.cancel_requested, Job.pause_requested, Job.lease_owner).where(
                        Job.id == self.job_id
                    )
                ).one_or_none()
        except Exception:
            log.warning("could not read cancel/pause requests for %s", self.job_id, exc_info=True)
            return
        if row is None or row.lease_owner != self.worker_id:
            self._lose_lease()
        elif row.cancel_requested:
            self.cause = "cancel"
        elif row.pause_requested:
            self.cause = "pause"

    def _lose_lease(self) -> None:
        if self.cause != "lease_lost":
            log.warning("job %s: lease lost; stopping without writing anything more", self.job_id)
        self.lease_lost.set()
        self.cause = "lease_lost"
        self.buffer.clear()


def delete_metrics_after(session: Session, job_id: str, step: int) -> int:
    """Remove metric rows after `step` (a restart from checkpoint `step` will log them again)."""
    result = session.execute(delete(Metric).where(Metric.job_id == job_id, Metric.step > step))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
