"""Loss and lifecycle of a job, three ways (all read from the database, the source of truth):

GET /v1/fine_tuning/jobs/{id}/events   OpenAI's shape, newest first, `after`/`limit`.
    Lifecycle Event rows are `type: "message"` events (their own ids); Metric rows are
    `type: "metrics"` events with `data {step, train_loss, valid_loss, learning_rate, grad_norm,
    tokens_per_s, tokens_seen}` and the id `ftevent-<job hex>-s<step>`. Both are ordered by
    (created_at, kind, seq|step), message after metrics at the same instant.

GET /v1/fine_tuning/jobs/{id}/metrics?after_step=N&limit=M&max_points=P
    `{object: "list", data: [{step, train_loss, val_loss, lr, tokens_per_s, tokens_seen, grad_norm,
    created_at}], has_more}` in step order, steps > after_step. `limit` (default 1000 without
    max_points, unbounded with it; at most 100000) cuts the window; `has_more` says rows exist
    past it. `max_points` downsamples the window to at most P points that always include its last
    point: the steps before the last are split into P-1 equal step ranges, each keeping one real
    row (its last evaluation row if it has one, so the validation curve survives, else its last
    row). Done in SQL: cheap for a 100,000-step job.

GET /v1/fine_tuning/jobs/{id}/stream   Server-Sent Events (text/event-stream):
    event: metrics   data: one point as in /metrics
    event: status    data: {status, message, created_at, job: <the job object>} — from each
                     lifecycle row that records a status change (and a snapshot if ever needed)
    event: message   data: an OpenAI event object, other lifecycle rows (warnings, requests)
    event: error     data: the error envelope, just before the stream closes because its key was
                     revoked (the key is re-checked every `stream_key_recheck_seconds`)
    Every event has `id: <S>.<Q>`: S = the highest metric step sent so far (-1 for none), Q = the
    highest lifecycle Event seq sent so far (0 for none); both are below 10**18. Reconnecting with
    `Last-Event-ID: S.Q` (what EventSource sends; or `?last_event_id=S.Q`) sends only metrics with
    step > S and lifecycle rows with seq > Q; an id of another shape is a 400 before the stream
    starts. The database is polled every 0.25 s with two indexed queries; a comment line
    `: keep-alive` goes out after 15 s of silence; the stream ends after the terminal status event
    (a reconnect to a finished job whose events were all seen gets an empty stream that ends at once).
    A metric row is sent once it is final, so the cursor never skips a later change to it: the
    worker upserts rows by step, and an evaluation fills `val_loss` of a row whose `train_loss` may
    already be stored. The trainer evaluates step S before it logs step S+1 and the worker writes its
    buffered rows in one transaction, so once a later row exists a row no longer changes; the newest
    row is held back while a worker is on the job (core.status.ACTIVE) and sent when the next row
    arrives or the job stops.
    Auth: the Bearer header, or `?api_key=<key>` for a browser's EventSource (it cannot send
    headers); only this route accepts a key in the URL (the access log never shows it: api/logs.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from api.deps import CurrentKey, SessionDep, StreamKey
from api.errors import error_body
from api.queries import AfterId, bad_cursor, owned_job
from api.request_models import Int64
from api.schemas import (
    JobEvent,
    ListEnvelope,
    job_hex,
    metric_point,
    to_event,
    to_job,
    to_metric_event,
    unix,
)
from core.db_faults import CONNECTION_ERRORS
from core.models import ApiKey, Event, Job, Metric
from core.status import ACTIVE, TERMINAL

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])

RANK_METRIC, RANK_MESSAGE = 0, 1
POLL_SECONDS = 0.25
HEARTBEAT_SECONDS = 15.0
STREAM_BATCH = 500
_METRIC_EVENT_RE = re.compile(r"^ftevent-([0-9a-f]+)-s([0-9]{1,18})$")
# "<highest metric step sent>.<highest event seq sent>", each below 10**18 (so inside 64 bits)
EVENT_ID_PATTERN = r"^(-1|[0-9]{1,18})\.[0-9]{1,18}$"
EVENT_ID_HELP = "resume after this event id of the stream (<step>.<seq>, as the stream sent it)"


# Metric steps and Event seqs are 32-bit INTEGER columns in PostgreSQL, which refuses to compare one
# with a larger bound; a cursor past their range is past every row, and one before it before all.
COLUMN_MIN, COLUMN_MAX = -1, 2**31 - 1


def in_column_range(n: int) -> int:
    return max(COLUMN_MIN, min(n, COLUMN_MAX))


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
    metrics = session.scalars(
        mq.order_by(Metric.created_at.desc(), Metric.step.desc()).limit(limit + 1)
    ).all()
    events = session.scalars(eq.order_by(Event.created_at.desc(), Event.seq.desc()).limit(limit + 1)).all()
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
    if max_points == 1:
        return list(session.scalars(select(Metric).where(*base, Metric.step == last)).all()), has_more
    width = max(1, math.ceil((last - lo) / (max_points - 1)))
    bucket = (Metric.step - lo) // width
    chosen = (
        select(
            func.coalesce(func.max(case((Metric.val_loss.is_not(None), Metric.step))), func.max(Metric.step))
        )
        .where(*base, Metric.step < last)
        .group_by(bucket)
    )
    rows = session.scalars(
        select(Metric).where(*base, or_(Metric.step.in_(chosen), Metric.step == last)).order_by(Metric.step)
    ).all()
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


# ------------------------------------------------------------------------------------------ stream
@dataclass
class StreamCursor:
    step: int = -1
    seq: int = 0

    def __str__(self) -> str:
        return f"{self.step}.{self.seq}"

    @classmethod
    def parse(cls, event_id: str) -> StreamCursor:
        """From an id this stream sent (the route's pattern has checked its shape and size)."""
        step, seq = event_id.split(".")
        return cls(in_column_range(int(step)), in_column_range(int(seq)))


def _sse(event: str, data: Any, id: str | None = None) -> str:
    lines = [f"event: {event}"]
    if id is not None:
        lines.append(f"id: {id}")
    lines.append("data: " + json.dumps(data, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


def _poll(
    factory: sessionmaker[Session], job_id: str, cursor: StreamCursor
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[Event]]:
    """One poll: the job (read first, so a terminal status implies its last metrics are visible
    too), then newer final metric rows (see the module docstring) and lifecycle rows."""
    with factory() as session:
        job = session.get(Job, job_id)
        if job is None:
            return None, [], []
        snapshot = to_job(job).model_dump(mode="json")
        metrics = list(
            session.scalars(
                select(Metric)
                .where(Metric.job_id == job_id, Metric.step > cursor.step)
                .order_by(Metric.step)
                .limit(STREAM_BATCH + 1)
            ).all()
        )
        if len(metrics) > STREAM_BATCH:
            metrics = metrics[:STREAM_BATCH]  # a later row exists: these are final
        elif metrics and job.status in ACTIVE:
            metrics = metrics[:-1]  # the newest row may still gain its val_loss
        events = session.scalars(
            select(Event)
            .where(Event.job_id == job_id, Event.seq > cursor.seq)
            .order_by(Event.seq)
            .limit(STREAM_BATCH)
        ).all()
        points = [metric_point(m) for m in metrics]
        for e in events:
            session.expunge(e)
        return snapshot, points, list(events)


def _status_of(e: Event) -> str | None:
    status = (e.data or {}).get("status") if isinstance(e.data, dict) else None
    return status if isinstance(status, str) else None


def _key_is_live(factory: sessionmaker[Session], key_id: str) -> bool:
    with factory() as session:
        found = session.scalar(select(ApiKey.id).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)))
        return found is not None


KEY_REVOKED = error_body(
    "The API key of this stream was revoked; the stream is closed.",
    "invalid_request_error",
    code="invalid_api_key",
)


async def _stream(
    request: Request, job_id: str, key_id: str, cursor: StreamCursor, sent_status: str | None
) -> AsyncIterator[str]:
    factory = request.app.state.session_factory
    recheck_seconds = request.app.state.settings.stream_key_recheck_seconds
    yield "retry: 2000\n\n"
    last_write = last_key_check = time.monotonic()
    while True:
        if await request.is_disconnected():
            return
        try:
            if time.monotonic() - last_key_check >= recheck_seconds:
                if not await run_in_threadpool(_key_is_live, factory, key_id):
                    yield _sse("error", KEY_REVOKED)
                    return
                last_key_check = time.monotonic()
            job, points, events = await run_in_threadpool(_poll, factory, job_id, cursor)
        except CONNECTION_ERRORS:  # the database is away: keep the stream open and poll again
            if time.monotonic() - last_write >= HEARTBEAT_SECONDS:
                yield ": keep-alive\n\n"
                last_write = time.monotonic()
            await asyncio.sleep(POLL_SECONDS)
            continue
        if job is None:
            return
        out: list[str] = []
        for p in points:
            cursor.step = max(cursor.step, int(p["step"]))
            out.append(_sse("metrics", p, str(cursor)))
        for e in events:
            cursor.seq = max(cursor.seq, e.seq)
            status = _status_of(e)
            if status is not None:
                sent_status = status
                out.append(
                    _sse(
                        "status",
                        {
                            "status": status,
                            "message": e.message,
                            "created_at": unix(e.created_at),
                            "job": job,
                        },
                        str(cursor),
                    )
                )
            else:
                out.append(_sse("message", to_event(e).model_dump(mode="json"), str(cursor)))
        drained = len(points) < STREAM_BATCH and len(events) < STREAM_BATCH
        if drained and job["status"] != sent_status and (sent_status is None or job["status"] in TERMINAL):
            # no lifecycle row told this client the current status yet: say it once
            sent_status = job["status"]
            out.append(
                _sse(
                    "status",
                    {
                        "status": sent_status,
                        "message": f"Job status: {sent_status}",
                        "created_at": int(time.time()),
                        "job": job,
                    },
                    str(cursor),
                )
            )
        if out:
            yield "".join(out)
            last_write = time.monotonic()
        if drained and job["status"] in TERMINAL and sent_status == job["status"]:
            return
        if not drained:
            continue
        if time.monotonic() - last_write >= HEARTBEAT_SECONDS:
            yield ": keep-alive\n\n"
            last_write = time.monotonic()
        await asyncio.sleep(POLL_SECONDS)


@router.get(
    "/jobs/{job_id}/stream",
    summary="Server-Sent Events: metrics and status as they happen",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream_job(
    job_id: str,
    request: Request,
    session: SessionDep,
    key: StreamKey,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", pattern=EVENT_ID_PATTERN, description=EVENT_ID_HELP)
    ] = None,
    last_event_id_query: Annotated[
        str | None, Query(alias="last_event_id", pattern=EVENT_ID_PATTERN, description=EVENT_ID_HELP)
    ] = None,
) -> StreamingResponse:
    job = await run_in_threadpool(owned_job, session, key.owner_id, job_id)
    resume_from = last_event_id or last_event_id_query
    cursor = StreamCursor.parse(resume_from) if resume_from else StreamCursor()
    # A resuming client has seen the status as of its cursor; newer changes arrive as rows.
    sent_status = job.status if resume_from else None
    await run_in_threadpool(session.close)
    return StreamingResponse(
        _stream(request, job.id, key.id, cursor, sent_status),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
