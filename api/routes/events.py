"""Loss and lifecycle of a job, three ways (all read from the database, the source of truth):

GET /v1/fine_tuning/jobs/{id}/events   OpenAI's shape, newest first, `after`/`limit`, `type`.
    Lifecycle Event rows are `type: "message"` events (their own ids); Metric rows are
    `type: "metrics"` events with `data {step, <each stored metric under its OpenAI name>}` (the
    names: trainer.config.metrics) and the id `ftevent-<job hex>-s<step>`. Both are ordered by
    (created_at, kind, seq|step), message after metrics at the same instant. `type=message` gives the
    lifecycle alone (status, checkpoints, evaluations, warnings), `type=metrics` the steps alone.

GET /v1/fine_tuning/jobs/{id}/metrics?after_step=N&limit=M&max_points=P
    `{object: "list", data: [{step, <each Metric column>, created_at}], has_more}` in step order,
    steps > after_step. `limit` (default 1000 without max_points, unbounded with it; at most
    100000) cuts the window; `has_more` says rows exist past it. `max_points` downsamples the
    window to at most P points that always include its first and last points (P = 1: the last): the
    steps between are split into P-2 equal step ranges, each keeping one real row (its last
    evaluation row if it has one, so the validation curve survives, else its last row). Done in SQL: cheap for a
    100,000-step job.

GET /v1/fine_tuning/jobs/{id}/stream   Server-Sent Events: api/routes/stream.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from sqlalchemy import ColumnElement, and_, case, func, or_, select
from sqlalchemy.orm import Session

from api.deps import CurrentKey, SessionDep
from api.queries import COLUMN_MAX, AfterId, bad_cursor, in_column_range, owned_job
from api.request_models import Int64
from api.schemas import JobEvent, ListEnvelope, job_hex, metric_point, to_event, to_metric_event
from core.models import Event, Job, Metric

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])

RANK_METRIC, RANK_MESSAGE = 0, 1
_METRIC_EVENT_RE = re.compile(r"^ftevent-([0-9a-f]+)-s([0-9]{1,18})$")


# ------------------------------------------------------------------------------------------ events
def _event_cursor(session: Session, job: Job, after: str) -> tuple[datetime, int, int]:
    m = _METRIC_EVENT_RE.match(after)
    if m:
        step = int(m.group(2))
        if m.group(1) != job_hex(job.id) or step > COLUMN_MAX:
            raise bad_cursor(after)
        row = session.get(Metric, (job.id, step))
        if row is None:
            raise bad_cursor(after)
        return row.created_at, RANK_METRIC, row.step
    ev = session.scalar(select(Event).where(Event.id == after, Event.job_id == job.id))
    if ev is None:
        raise bad_cursor(after)
    return ev.created_at, RANK_MESSAGE, ev.seq


@router.get(
    "/jobs/{job_id}/events",
    response_model=ListEnvelope[JobEvent],
    summary="A job's events, newest first (lifecycle messages and per-step metrics)",
)
def list_events(
    job_id: str,
    session: SessionDep,
    key: CurrentKey,
    after: AfterId = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 20,
    type: Annotated[
        Literal["message", "metrics"] | None,
        Query(description="only lifecycle messages, or only per-step metrics (OpenAI's event types)"),
    ] = None,
) -> ListEnvelope[JobEvent]:
    job = owned_job(session, key.owner_id, job_id)
    mq = select(Metric).where(Metric.job_id == job.id)
    eq = select(Event).where(Event.job_id == job.id)
    if after:
        at, rank, n = _event_cursor(session, job, after)
        if rank == RANK_METRIC:
            mq = mq.where(or_(Metric.created_at < at, and_(Metric.created_at == at, Metric.step < n)))
            eq = eq.where(Event.created_at < at)
        else:
            mq = mq.where(Metric.created_at <= at)
            eq = eq.where(or_(Event.created_at < at, and_(Event.created_at == at, Event.seq < n)))
    metrics: Sequence[Metric] = []
    events: Sequence[Event] = []
    if type != "message":
        metrics = session.scalars(
            mq.order_by(Metric.created_at.desc(), Metric.step.desc()).limit(limit + 1)
        ).all()
    if type != "metrics":
        events = session.scalars(
            eq.order_by(Event.created_at.desc(), Event.seq.desc()).limit(limit + 1)
        ).all()
    merged: list[tuple[datetime, int, int, JobEvent]] = [
        (m.created_at, RANK_METRIC, m.step, to_metric_event(job.id, m, job.total_steps)) for m in metrics
    ]
    merged += [(e.created_at, RANK_MESSAGE, e.seq, to_event(e)) for e in events]
    merged.sort(key=lambda t: (t[0], t[1], t[2]), reverse=True)
    page = [t[3] for t in merged[: limit + 1]]
    data = page[:limit]
    return ListEnvelope.of(data, has_more=len(page) > limit)


# ----------------------------------------------------------------------------------------- metrics
def select_metrics(
    session: Session, job_id: str, after_step: int | None, limit: int | None, max_points: int | None
) -> tuple[list[Metric], bool]:
    """Rows in step order (see the module docstring); returns (rows, has_more)."""
    base = [Metric.job_id == job_id]
    if after_step is not None:
        base.append(Metric.step > in_column_range(after_step))
    has_more = False
    if limit is not None:
        upper = session.scalar(
            select(Metric.step).where(*base).order_by(Metric.step).offset(limit - 1).limit(1)
        )
        if upper is not None:
            has_more = (
                session.scalar(select(Metric.step).where(*base, Metric.step > upper).limit(1)) is not None
            )
            base.append(Metric.step <= upper)
    if max_points is None:
        return list(session.scalars(select(Metric).where(*base).order_by(Metric.step)).all()), has_more
    lo, last, count = session.execute(
        select(func.min(Metric.step), func.max(Metric.step), func.count()).where(*base)
    ).one()
    if not count:
        return [], has_more
    if count <= max_points:
        return list(session.scalars(select(Metric).where(*base).order_by(Metric.step)).all()), has_more
    ends = [last] if max_points == 1 else [lo, last]
    kept: ColumnElement[bool] = Metric.step.in_(ends)
    if between := max_points - len(ends):  # buckets of the steps between the first and the last
        width = max(1, math.ceil((last - lo - 1) / between))
        chosen = (
            select(
                func.coalesce(
                    func.max(case((Metric.val_loss.is_not(None), Metric.step))), func.max(Metric.step)
                )
            )
            .where(*base, Metric.step > lo, Metric.step < last)
            .group_by((Metric.step - lo - 1) // width)
        )
        kept = or_(kept, Metric.step.in_(chosen))
    rows = session.scalars(select(Metric).where(*base, kept).order_by(Metric.step)).all()
    return list(rows), has_more


@router.get("/jobs/{job_id}/metrics", summary="A job's metrics in step order, optionally downsampled")
def list_metrics(
    job_id: str,
    session: SessionDep,
    key: CurrentKey,
    after_step: Annotated[Int64 | None, Query(description="only steps greater than this")] = None,
    limit: Annotated[
        int | None, Query(ge=1, le=100_000, description="window size (default 1000 without max_points)")
    ] = None,
    max_points: Annotated[
        int | None, Query(ge=1, le=100_000, description="downsample to at most this many points")
    ] = None,
) -> dict[str, Any]:
    job = owned_job(session, key.owner_id, job_id)
    if limit is None and max_points is None:
        limit = 1000
    rows, has_more = select_metrics(session, job.id, after_step, limit, max_points)
    data = [metric_point(m) for m in rows]
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "job_status": job.status,
        "total_steps": job.total_steps,
    }
