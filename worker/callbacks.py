"""The trainer's callbacks as the service needs them (`ServiceCallbacks`): metrics and progress
into the database, step checkpoints into the blob store, cancel/pause/shutdown/lost-lease into
`should_stop`.

Every write needs this worker to still hold the job's lease: a worker whose lease expired (too
slow to heartbeat, or the reaper gave its job away) stops writing at once, and training next step.

Metrics are buffered and written in one transaction every `metrics_flush_seconds` (or every
`FLUSH_ROWS` rows), together with the job's progress columns (worker.metric_rows); a decision the
run notes (a compile) is written at once.

While the database is unreachable training goes on: the rows stay buffered and are written when it
comes back (worker.db_retry). A checkpoint first waits until the rows up to its step are written,
so a resume from it finds every earlier step; then it uploads in the background while training goes
on (worker.checkpoint_uploads). Past `db_retry_seconds` the writes raise DatabaseUnavailable and the
attempt is given up (worker.job_run).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.jobstates import add_event
from core.models import Checkpoint, Job
from trainer.checkpoint import best_of_run
from trainer.config.metrics import (
    BY_NAME,
    METRICS,
    OPENAI_NAMES,
    PROGRESS_COLUMNS,
    EvalMetrics,
    FullEvalMetrics,
    StepMetrics,
    values,
)
from trainer.config.throughput import StepRate
from trainer.run.report import Callbacks
from worker.checkpoint_store import store_checkpoint
from worker.checkpoint_uploads import CheckpointUploads, checkpoint_costs_event
from worker.db_retry import DbRetry
from worker.lease import LeaseLost
from worker.metric_rows import MetricValues, Requests, stored_metrics, write_progress
from worker.system_metrics import SystemSampler

if TYPE_CHECKING:
    from core.blobstore import BlobStore
    from trainer.run.checkpoint_writer import CheckpointTimes
    from trainer.run.state import StartInfo

log = logging.getLogger(__name__)

FLUSH_ROWS = 50  # flush the metric buffer when it holds this many steps, whatever the time
# How often should_stop() reads cancel/pause requests from the database. Every metrics flush reads
# them too (in its UPDATE), so with flushes at least this often no separate query is made.
STOP_CHECK_SECONDS = 1.0

# why the run is being stopped (the first reason seen wins, but a cancel overrides a pause or shutdown)
StopCause = Literal["cancel", "pause", "shutdown", "lease_lost"]
OVERRIDDEN_BY_CANCEL: tuple[StopCause | None, ...] = (None, "pause", "shutdown")


class ServiceCallbacks(Callbacks):
    """Callbacks for one claimed job. Thread-safety: the trainer calls everything on its thread;
    the heartbeat thread only sets `lease_lost` (an Event) and the worker's signal handler only sets
    `shutdown`; a checkpoint's upload thread touches none of the buffers here."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        store: BlobStore,
        *,
        job_id: str,
        worker_id: str,
        checkpoint_model_id: Callable[[int], str],
        scratch: Path,
        flush_seconds: float = 1.0,
        keep_checkpoints: int | None,  # the job's, capped by the service (worker.job_run decides)
        max_stored_bytes: int | None = None,
        lease_lost: threading.Event | None = None,
        shutdown: threading.Event | None = None,
        flush_rows: int = FLUSH_ROWS,
        stop_check_seconds: float = STOP_CHECK_SECONDS,
        db_retry_seconds: float,
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
        self.max_stored_bytes = max_stored_bytes  # the owner's storage quota (pruning keeps inside it)
        self.stop_check_seconds = stop_check_seconds
        self.lease_lost = lease_lost or threading.Event()
        self.shutdown = shutdown or threading.Event()
        self.cause: StopCause | None = None
        self.buffer: dict[int, MetricValues] = {}
        self.progress: dict[str, Any] = {}
        self.last_flush = time.monotonic()
        self.last_check = 0.0
        self.latest: dict[str, float | None] = {}  # the newest value of each stored metric
        self.full_valid: dict[str, float | None] = {}  # the final full validation pass
        self.full_valid_step: int | None = None
        self.events: list[tuple[str, dict[str, Any]]] = []  # info events written with the next flush
        self.warnings: list[str] = []  # warn events (settings without effect), with the next flush
        self.latest_step = 0  # the step of the newest measurement (`latest`)
        self.latest_eval_step: int | None = None  # the step of the newest evaluation in `latest`
        self.tokens_per_step = 0
        self.rate = StepRate()  # the job's tokens/s and ETA: smoothed over measured steps
        self.stored_steps: list[int] = []
        self.first_step_written = False  # the first loss of a run is written at once (time to first loss)
        self.metrics_db = DbRetry("metrics writes", db_retry_seconds)
        self.checkpoint_db = DbRetry("checkpoint writes", db_retry_seconds)
        # asked while an upload retries through an outage: a job cancelled (or lost) needs no checkpoint
        cancelled = lambda: self.should_stop() == "stop"  # noqa: E731
        self.uploads = CheckpointUploads(scratch / "uploading", db_retry_seconds, cancelled)
        self.requests_db = DbRetry("cancel/pause checks", action="paused")  # metrics writes give up
        self.system = SystemSampler()  # CPU, memory, device: on each flush's newest row

    # ------------------------------------------------------------------ trainer hooks
    def on_start(self, info: StartInfo) -> None:
        # an attempt's rate is its own: none until its first steps are measured (not the last attempt's)
        self.tokens_per_step, self.rate = int(info["tokens_per_step"]), StepRate(int(info["start_step"]))
        self.progress.update(
            total_steps=int(info["total_steps"]), step=int(info["start_step"]), tokens_per_s=None
        )
        self.latest_step = int(info["start_step"])
        where = info["device"]
        if info["processes"] > 1:  # device: rank 0's
            where = f"{info['processes']} x {where.split(':')[0]}"
        self.events.append(
            (
                f"Training on {where} in {info['dtype']}: {info['n_params']:,} parameters, "
                f"{info['tokens_per_step']:,} tokens per step",
                dict(info),
            )
        )
        self.events += [(f"Hyperparameter {decided}", {}) for decided in info["auto"]]
        self.warnings += info["notes"]
        self.flush()

    def on_step(self, metrics: StepMetrics) -> None:
        self.rate.observe_log(metrics.step, metrics.tokens_per_s, self.tokens_per_step)
        self._record(metrics)

    def on_eval(self, metrics: EvalMetrics) -> None:
        self._record(metrics)

    def _record(self, measured: StepMetrics | EvalMetrics) -> None:
        """Buffer the stored metrics (non-finite values as None) for the step's Metric row, keep the
        newest for checkpoints and copy those the job's progress shows."""
        if self.lease_lost.is_set():
            return
        row = {name: _finite(value) for name, value in values(measured).items() if BY_NAME[name].stored}
        self.buffer.setdefault(measured.step, {}).update(row)
        self.latest.update(row)
        if isinstance(measured, EvalMetrics):
            self.latest_eval_step = measured.step
        progress = {PROGRESS_COLUMNS[name]: row[name] for name in row if name in PROGRESS_COLUMNS}
        if "tokens_per_s" in row:  # the job shows the smoothed rate; the step's row keeps its own
            progress[PROGRESS_COLUMNS["tokens_per_s"]] = self.rate.tokens_per_s(self.tokens_per_step)
        self.progress.update(progress)
        self.progress["step"] = max(measured.step, self.progress.get("step", 0))
        self.latest_step = max(measured.step, self.latest_step)
        self.maybe_flush()

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        """Kept for the final checkpoint's metrics (checkpoint_metrics) and recorded as an event."""
        if self.lease_lost.is_set():
            return
        self.full_valid = {name: _finite(value) for name, value in values(metrics).items()}
        shown = ", ".join(
            f"{BY_NAME[name].label}={value:.4f}"
            for name, value in self.full_valid.items()
            if value is not None
        )
        self.events.append(
            (
                f"Full validation at step {metrics.step}: {shown or 'no finite value'}",
                {"step": metrics.step, **{OPENAI_NAMES[name]: v for name, v in self.full_valid.items()}},
            )
        )
        self.full_valid_step = metrics.step
        self.maybe_flush()

    def on_note(self, message: str) -> None:
        """A decision made while running: an info event, now (a compile runs for minutes after it)."""
        self.events.append((message, {}))
        self.flush()

    def on_checkpoint(self, step: int, path: Path) -> None:
        """A step checkpoint on disk: staged and stored in the background (worker.checkpoint_uploads),
        with the best evaluation's checkpoint it names when that is not stored yet."""
        # A cancelled job needs no checkpoint; a worker without the lease must not write.
        if self.cause in ("cancel", "lease_lost") or self.lease_lost.is_set():
            return
        try:
            self.flush(wait=True)  # the rows up to this step first: a resume from it must find them all
            if self.lease_lost.is_set():
                return
            best_step, best = best_of_run(path)
            folders = [(step, path)]
            if best is not None and best_step is not None and not self._is_stored(best_step):
                # an attempt that resumes from `path` on another worker gets it back from the store
                # (worker.checkpoint_restore.restore_best): the job's model when it ends past it
                folders.append((best_step, best))
            metrics = {at: self.checkpoint_metrics(at) for at, _ in folders}
            self.stored_steps += [at for at, _ in folders]

            def store(at: int, folder: Path, retry: DbRetry) -> None:
                self._store(at, folder, best_step, metrics[at], retry)

            self.uploads.submit(folders, store)
        except LeaseLost:
            self._lose_lease()

    def wait_for_uploads(self, trained: CheckpointTimes | None = None) -> None:
        """Until the checkpoint upload in flight is stored (its error raises here); then, given the
        trainer's side of the costs, one event saying what the background checkpoints cost."""
        try:
            if not self.uploads.wait():
                return  # abandoned: the job was cancelled while the upload retried through an outage
        except LeaseLost:
            self._lose_lease()
            return
        if trained is not None and trained.count:
            self.events.append(checkpoint_costs_event(trained, self.uploads.count, self.uploads.seconds))

    def _is_stored(self, step: int) -> bool:
        """Stored (or being stored) by this attempt, or by an earlier attempt of the job (a resumed
        attempt does not upload the best checkpoint a second time)."""
        if step in self.stored_steps:
            return True

        def read() -> bool:
            with self.session_factory() as session:
                found = select(Checkpoint.id).where(Checkpoint.job_id == self.job_id, Checkpoint.step == step)
                return session.scalar(found) is not None

        if self.checkpoint_db.call(read):
            self.stored_steps.append(step)
            return True
        return False

    def _store(
        self, step: int, folder: Path, best_step: int | None, metrics: dict[str, Any], retry: DbRetry
    ) -> None:
        """A step checkpoint into the store; rotation keeps the run's best so far (`best_step`)."""
        store_checkpoint(
            self.session_factory,
            self.store,
            job_id=self.job_id,
            worker_id=self.worker_id,
            step=step,
            folder=folder,
            model_id=self.checkpoint_model_id(step),
            metrics=metrics,
            is_final=False,
            keep=self.keep_checkpoints,
            max_stored_bytes=self.max_stored_bytes,
            retry=retry,
            protect_step=best_step,
        )

    def should_stop(self) -> Literal["stop", "pause"] | None:
        if self.lease_lost.is_set():
            self._lose_lease()
        if self.cause in OVERRIDDEN_BY_CANCEL:  # after a pause, still read: a cancel overrides it
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
        """A checkpoint's metrics, OpenAI's names: the newest value of each metric the registry puts
        in checkpoints (None when not measured yet), and for the final checkpoint (the step of the full
        validation pass) the full validation metrics too. An evaluation's are a checkpoint's only when
        made at its step: a pause between evaluations has none, not an older step's. A step before the
        newest measurement (the best evaluation's, when it is the model) has its stored metric row's."""
        final = self.full_valid if self.full_valid_step == step else {}
        if step >= self.latest_step:
            evaluated = self.latest_eval_step == step
            measured = {k: v for k, v in self.latest.items() if evaluated or BY_NAME[k].phase != "eval"}
        else:
            measured = self._stored(step)
        measured.update(final)
        return {
            "step": step,
            **{
                OPENAI_NAMES[spec.name]: measured.get(spec.name)
                for spec in METRICS
                if spec.checkpoint and (spec.phase != "full_eval" or final)
            },
        }

    def _stored(self, step: int) -> MetricValues:
        def read() -> MetricValues:
            with self.session_factory() as session:
                return stored_metrics(session, self.job_id, step)

        return self.checkpoint_db.call(read)

    def maybe_flush(self) -> None:
        if (
            not self.first_step_written
            or len(self.buffer) >= self.flush_rows
            or time.monotonic() - self.last_flush >= self.flush_seconds
        ):
            self.first_step_written = bool(self.buffer)
            self.flush()

    def flush(self, wait: bool = False) -> None:
        """Write buffered metrics and the job's progress in one transaction (if the lease holds).
        While the database is unreachable the rows stay buffered for the next flush; `wait`
        retries until they are written (DatabaseUnavailable past db_retry_seconds)."""
        self.last_flush = time.monotonic()
        if self.lease_lost.is_set() or not (self.buffer or self.progress or self.events or self.warnings):
            return
        self.system.add_to(self.buffer)
        try:
            if wait:
                self.metrics_db.call(self._write_buffer)
            elif not self.metrics_db.try_once(self._write_buffer):
                return
        except LeaseLost:
            self._lose_lease()
            return
        self.buffer, self.progress, self.events, self.warnings = {}, {}, [], []

    def _write_buffer(self) -> None:
        with self.session_factory() as session:
            requests = write_progress(session, self.job_id, self.worker_id, self.progress, self.buffer)
            if requests is None:
                session.rollback()
                raise LeaseLost(self.job_id)
            for message, data in self.events:
                add_event(session, self.job_id, message, data=data)
            for message in self.warnings:
                add_event(session, self.job_id, message, level="warn")
            session.commit()
        self.last_check = time.monotonic()  # this flush was a stop check too
        self._take_requests(requests)

    def _read_requests(self) -> None:
        row: Any = None

        def read() -> None:
            nonlocal row
            with self.session_factory() as session:
                query = select(Job.cancel_requested, Job.pause_requested, Job.lease_owner)
                row = session.execute(query.where(Job.id == self.job_id)).one_or_none()

        try:
            if not self.requests_db.try_once(read):
                return  # the database is away: nobody can ask for anything meanwhile
        except Exception:
            log.warning("could not read cancel/pause requests for %s", self.job_id, exc_info=True)
            return
        if row is None or row.lease_owner != self.worker_id:
            self._lose_lease()
        else:
            self._take_requests(Requests(cancel=bool(row.cancel_requested), pause=bool(row.pause_requested)))

    def _take_requests(self, requests: Requests) -> None:
        """A cancel or pause the owner asked for becomes the run's stop cause: the first one wins, but
        a cancel (final) overrides a pause or shutdown, which may be waiting on an upload's outage."""
        if requests.cancel and self.cause in OVERRIDDEN_BY_CANCEL:
            self.cause = "cancel"
        elif requests.pause and self.cause is None:
            self.cause = "pause"

    def _lose_lease(self) -> None:
        if self.cause != "lease_lost":
            log.warning("job %s: lease lost; stopping without writing anything more", self.job_id)
        self.lease_lost.set()
        self.cause = "lease_lost"
        self.buffer.clear()


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
