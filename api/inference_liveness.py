"""Is the inference worker still there? What the API tells a completion's client when it is not.

- **a worker that died mid-request**: the worker that took a request names itself in the row and
  refreshes its `heartbeat_at` every inference_heartbeat_seconds while it works (model loading
  included: worker/inference.py). `HeartbeatWatch` notes when the API last saw the heartbeat
  change, by the API's own clock (no clock skew between machines); unchanged for
  inference_lease_seconds (10 s), the worker is lost: 503 `inference_worker_lost` naming it.
- **busy, not absent**: no worker took the request within inference_wait_seconds. When an
  inference worker is alive (advertised in `workers` within lease_seconds, or running a completion
  whose heartbeat is fresh), the answer is 503 `inference_workers_busy` with Retry-After: try again
  soon; only when none is, 503 `no_inference_worker` (start one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.errors import APIError
from core.models import InferenceRequest, Worker, utcnow
from core.settings import INFERENCE_QUEUE, Settings

BUSY_RETRY_AFTER_SECONDS = 5


@dataclass
class HeartbeatWatch:
    """The heartbeat of one request's worker, as the API polls it."""

    lease: float  # inference_lease_seconds
    worker: str | None = None
    beat: datetime | None = None
    changed: float = field(default_factory=time.monotonic)

    def seen(self, worker: str | None, beat: datetime | None) -> None:
        if (worker, beat) != (self.worker, self.beat):
            self.worker, self.beat, self.changed = worker, beat, time.monotonic()

    def lost(self) -> APIError | None:
        """The error to answer once the heartbeat stopped (rows without one are never lost here)."""
        if self.beat is None or time.monotonic() - self.changed < self.lease:
            return None
        return APIError(
            503,
            f"The inference worker {self.worker or '(unnamed)'} stopped answering: no heartbeat for "
            f"{self.lease:g} s (inference_lease_seconds); it may have been killed or restarted. Try again.",
            code="inference_worker_lost",
        )


def workers_alive(session: Session, settings: Settings) -> tuple[int, int]:
    """(inference workers advertised within lease_seconds, completions running with a fresh heartbeat)."""
    now = utcnow()
    queues = session.scalars(select(Worker.queues).where(Worker.alive(settings.lease_seconds))).all()
    advertised = sum(INFERENCE_QUEUE in (q or []) for q in queues)
    running = session.scalar(
        select(func.count())
        .select_from(InferenceRequest)
        .where(
            InferenceRequest.status == "running",
            InferenceRequest.heartbeat_at >= now - timedelta(seconds=settings.inference_lease_seconds),
        )
    )
    return advertised, int(running or 0)


def busy(workers: int, running: int, wait: float) -> APIError:
    return APIError(
        503,
        f"All inference workers are busy ({workers} alive, {running} completions running): none "
        f"took the request within {wait:g} s (inference_wait_seconds). Try again in a few seconds, "
        "or add workers (`fromscratch worker --queues inference`, inference_concurrency).",
        code="inference_workers_busy",
        headers={"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)},
        retry=True,
    )
