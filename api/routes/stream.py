"""GET /v1/fine_tuning/jobs/{id}/stream   Server-Sent Events (text/event-stream), resumable:
event: metrics   data: one point as in /metrics
event: status    data: {status, message, created_at, job: <the job object>} — from a lifecycle
                 row that records a change to the status the job has now (so `status` and
                 `job.status` always agree, as REST does), or a snapshot when no row told it yet
event: message   data: an OpenAI event object: the other lifecycle rows (warnings, requests, and
                 the changes to statuses the job has since left: its history)
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
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.deps import SessionDep, StreamKey
from api.errors import error_body
from api.queries import in_column_range, owned_job
from api.schemas import metric_point, to_event, to_job, unix
from api.stream_limits import stream_limits
from api.waiting import waiting_for
from core.db_faults import CONNECTION_ERRORS
from core.models import ApiKey, Event, Job, Metric
from core.settings import Settings
from core.status import ACTIVE, TERMINAL

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])

POLL_SECONDS = 0.25
HEARTBEAT_SECONDS = 15.0
STREAM_BATCH = 500
# "<highest metric step sent>.<highest event seq sent>", each below 10**18 (so inside 64 bits)
EVENT_ID_PATTERN = r"^(-1|[0-9]{1,18})\.[0-9]{1,18}$"
EVENT_ID_HELP = "resume after this event id of the stream (<step>.<seq>, as the stream sent it)"
KEY_REVOKED = error_body(
    "The API key of this stream was revoked; the stream is closed.",
    "invalid_request_error",
    code="invalid_api_key",
)
# after a poll: poll again at once (more rows wait), after a pause, or close the stream
NextPoll = Literal["again", "wait", "close"]


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
    factory: sessionmaker[Session], settings: Settings, job_id: str, cursor: StreamCursor
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[Event]]:
    """One poll: the newer lifecycle rows, then the job (so every status a row records is one the
    job has now or has left), then newer final metric rows (read after the job, so a terminal
    status implies its last metrics are visible too; see the module docstring)."""
    with factory() as session:
        events = session.scalars(
            select(Event)
            .where(Event.job_id == job_id, Event.seq > cursor.seq)
            .order_by(Event.seq)
            .limit(STREAM_BATCH)
        ).all()
        job = session.get(Job, job_id)
        if job is None:
            return None, [], []
        snapshot = to_job(job, waiting_for(session, job, settings)).model_dump(mode="json")
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


class _JobStream:
    """One client's stream of a job: polls, renders what is new since its cursor, and knows which
    status the client has been told."""

    def __init__(
        self, request: Request, job_id: str, key_id: str, cursor: StreamCursor, sent_status: str | None
    ):
        self.request, self.job_id, self.key_id = request, job_id, key_id
        self.cursor, self.sent_status = cursor, sent_status
        self.factory: sessionmaker[Session] = request.app.state.session_factory
        self.limits = stream_limits(request.app)
        self.settings: Settings = request.app.state.settings
        self.recheck_seconds = self.settings.stream_key_recheck_seconds
        self.last_write = self.last_key_check = time.monotonic()

    async def frames(self) -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        self.last_write = self.last_key_check = time.monotonic()
        while not await self.request.is_disconnected():
            text, next_poll = await self._poll_once()
            if text:
                yield text
                self.last_write = time.monotonic()
            if next_poll == "close":
                return
            if next_poll == "wait":
                if time.monotonic() - self.last_write >= HEARTBEAT_SECONDS:
                    yield ": keep-alive\n\n"
                    self.last_write = time.monotonic()
                await asyncio.sleep(POLL_SECONDS)

    async def _poll_once(self) -> tuple[str, NextPoll]:
        """What to send after one poll, and when to poll next."""
        try:
            if time.monotonic() - self.last_key_check >= self.recheck_seconds:
                if not await self.limits.run(_key_is_live, self.factory, self.key_id):
                    return _sse("error", KEY_REVOKED), "close"
                self.last_key_check = time.monotonic()
            job, points, events = await self.limits.run(
                _poll, self.factory, self.settings, self.job_id, self.cursor
            )
        except CONNECTION_ERRORS:  # the database is away: keep the stream open and poll again
            return "", "wait"
        if job is None:
            return "", "close"
        drained = len(points) < STREAM_BATCH and len(events) < STREAM_BATCH
        text = self._render(job, points, events, drained)
        if not drained:
            return text, "again"
        if job["status"] in TERMINAL and self.sent_status == job["status"]:
            return text, "close"
        return text, "wait"

    def _render(
        self, job: dict[str, Any], points: list[dict[str, Any]], events: list[Event], drained: bool
    ) -> str:
        """The polled rows as SSE events (advancing the cursor), and the job's status when no
        lifecycle row has told the client yet."""
        out: list[str] = []
        for p in points:
            self.cursor.step = max(self.cursor.step, int(p["step"]))
            out.append(_sse("metrics", p, str(self.cursor)))
        for e in events:
            self.cursor.seq = max(self.cursor.seq, e.seq)
            changed_to = _status_of(e)
            if changed_to is None or changed_to != job["status"]:  # not a change, or to a status since left
                out.append(_sse("message", to_event(e).model_dump(mode="json"), str(self.cursor)))
            else:
                self.sent_status = changed_to
                out.append(self._status_event(changed_to, e.message, unix(e.created_at), job))
        status = job["status"]
        if drained and status != self.sent_status and (self.sent_status is None or status in TERMINAL):
            # no lifecycle row told this client the current status yet: say it once
            self.sent_status = status
            out.append(self._status_event(status, f"Job status: {status}", int(time.time()), job))
        return "".join(out)

    def _status_event(self, status: str, message: str, created_at: int | None, job: dict[str, Any]) -> str:
        data = {"status": status, "message": message, "created_at": created_at, "job": job}
        return _sse("status", data, str(self.cursor))


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
    frames = _JobStream(request, job.id, key.id, cursor, sent_status).frames()
    return StreamingResponse(
        stream_limits(request.app).guarded(key.id, frames),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
