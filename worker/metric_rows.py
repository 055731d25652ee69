"""A job's Metric rows and progress columns in the database.

Rows are upserted by (job_id, step): an evaluation at a step fills that row's `val_loss` and
`val_accuracy`, and a value never overwrites a stored one with None. The columns are the registry's
stored metrics (trainer.config.metrics). A restart from checkpoint step S deletes the rows
after S first (`delete_metrics_after`), so the series never holds a step twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import delete, func, update
from sqlalchemy.orm import Session

from core.models import Job, Metric, utcnow
from trainer.config.metrics import STORED

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PostgresInsert
    from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

METRIC_COLUMNS = tuple(spec.name for spec in STORED)

# one step's metric values by column (a value not measured at that step is absent or None)
MetricValues = dict[str, float | None]


class Requests(NamedTuple):
    """What the job's owner has asked of the training run, as the database holds it."""

    cancel: bool
    pause: bool


def write_progress(
    session: Session, job_id: str, worker_id: str, progress: dict[str, Any], rows: dict[int, MetricValues]
) -> Requests | None:
    """Update the job's progress columns and upsert its metric rows, only while `worker_id` holds
    the job's lease (the caller commits). Returns the cancel/pause requests the same UPDATE read
    back (so a flush is also a stop check, without a query of its own); None, with nothing
    written, when the lease is gone."""
    row = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id)
        .values(**progress, updated_at=utcnow())
        .returning(Job.cancel_requested, Job.pause_requested)
    ).one_or_none()
    if row is None:
        return None
    upsert_metrics(session, job_id, rows)
    return Requests(cancel=bool(row.cancel_requested), pause=bool(row.pause_requested))


def upsert_metrics(session: Session, job_id: str, rows: dict[int, MetricValues]) -> None:
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


def stored_metrics(session: Session, job_id: str, step: int) -> MetricValues:
    """The values stored for `step` by column ({} when no row was written for it)."""
    row = session.get(Metric, (job_id, step))
    return {} if row is None else {c: getattr(row, c) for c in METRIC_COLUMNS}


def delete_metrics_after(session: Session, job_id: str, step: int) -> int:
    """Remove metric rows after `step` (a restart from checkpoint `step` will log them again)."""
    result = session.execute(delete(Metric).where(Metric.job_id == job_id, Metric.step > step))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _insert(session: Session) -> Callable[[type[Metric]], PostgresInsert | SqliteInsert]:
    """The dialect's INSERT with ON CONFLICT (PostgreSQL and SQLite both have it)."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert
    if name == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.insert
    raise RuntimeError(f"unsupported database dialect {name!r}")  # pragma: no cover - only these two
