"""Open endpoints (no key): /healthz (the process answers), /readyz (database and broker reachable
and the schema migrated to this code's revision, else 503 in the error envelope with `Retry-After`,
the message naming what is wrong), /metrics (Prometheus
text format; behind a bearer token of its own when `metrics_token` is set).

Prometheus metrics (one registry per app, so tests can build many apps):
- `fromscratch_http_request_duration_seconds{method, route, status}` histogram: time to the
  response's first byte (for SSE streams that is the time to open the stream), by route template;
- `fromscratch_jobs{status}` gauge, computed from the database at scrape time;
- `fromscratch_queue_depth{queue}` gauge: jobs waiting for a worker (validating_files/queued,
  not claimed);
- `fromscratch_training_tokens_per_second{job_id, queue}` for running jobs and
  `fromscratch_training_tokens_per_second_total` their sum;
- `fromscratch_workers{queue, device_kind}` gauge: live workers consuming each queue (a worker
  row refreshed within `lease_seconds`, as GET /v1/workers lists them); a queue with a depth and
  no worker waits for one to start;
- `fromscratch_database_up` 1/0 (0 when the scrape-time queries failed).
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from api.db_errors import RETRY_AFTER_SECONDS
from api.errors import error_response
from core.broker_faults import describe as describe_broker_error
from core.db_faults import OutageLog, is_connection_error
from core.db_faults import describe as describe_db_error
from core.migrate import schema_problem
from core.models import Job, Worker
from core.status import JobStatus

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("fromscratch.api")
router = APIRouter(tags=["health"])


class JobsCollector(Collector):
    def __init__(self, session_factory: sessionmaker[Session], lease_seconds: float) -> None:
        self.session_factory, self.lease_seconds = session_factory, lease_seconds
        self.outage = OutageLog("metrics scrape", log, action="reports fromscratch_database_up 0")

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("fromscratch_database_up", "1 when the scrape-time database queries succeeded")
        try:
            with self.session_factory() as s:
                counts = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
                waiting = s.execute(
                    select(Job.queue, func.count()).where(Job.unclaimed()).group_by(Job.queue)
                ).all()
                running = s.execute(
                    select(Job.id, Job.queue, Job.tokens_per_s).where(Job.status == JobStatus.RUNNING)
                ).all()
                alive = Worker.alive(self.lease_seconds)
                workers = s.execute(select(Worker.queues, Worker.device_kind).where(alive))
                live = Counter((queue, kind) for queues, kind in workers for queue in queues)
        except Exception as exc:  # a scrape must not fail because the database is down
            if is_connection_error(exc):
                self.outage.failed(exc)  # once per outage
            else:
                log.warning("metrics scrape: database query failed", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        self.outage.reachable()
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily("fromscratch_jobs", "Jobs by status", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], float(counts.get(status, 0)))
        yield jobs
        depth = GaugeMetricFamily("fromscratch_queue_depth", "Jobs waiting for a worker", labels=["queue"])
        waiting_by_queue = dict(waiting)
        for queue in sorted({"cpu", "gpu", *waiting_by_queue}):
            depth.add_metric([queue], float(waiting_by_queue.get(queue, 0)))
        yield depth
        yield self._workers(live)
        tps = GaugeMetricFamily(
            "fromscratch_training_tokens_per_second",
            "Training throughput of running jobs",
            labels=["job_id", "queue"],
        )
        total = 0.0
        for job_id, queue, value in running:
            tps.add_metric([job_id, queue], float(value or 0.0))
            total += float(value or 0.0)
        yield tps
        yield GaugeMetricFamily(
            "fromscratch_training_tokens_per_second_total",
            "Sum of the training throughput of running jobs",
            value=total,
        )

    @staticmethod
    def _workers(live: Counter[tuple[str, str]]) -> GaugeMetricFamily:
        workers = GaugeMetricFamily(
            "fromscratch_workers", "Live workers consuming a queue", labels=["queue", "device_kind"]
        )
        for (queue, kind), count in sorted(live.items()):
            workers.add_metric([queue, kind], float(count))
        return workers


def make_registry(
    session_factory: sessionmaker[Session], lease_seconds: float
) -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry(auto_describe=False)
    latency = Histogram(
        "fromscratch_http_request_duration_seconds",
        "HTTP request latency (to the first byte)",
        ["method", "route", "status"],
        registry=registry,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    )
    registry.register(JobsCollector(session_factory, lease_seconds))
    return registry, latency


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _check_broker(celery: Celery) -> None:
    with celery.connection_for_write() as conn:
        conn.ensure_connection(
            max_retries=1, interval_start=0, interval_step=0.2, interval_max=0.5, timeout=3
        )


@router.get("/readyz", summary="Database and broker reachable (503 otherwise)")
def readyz(request: Request) -> Response:
    checks: dict[str, str] = {}
    problems: list[str] = []
    try:
        with request.app.state.session_factory() as s:
            s.execute(text("SELECT 1"))
            schema = schema_problem(s.connection())
        checks["database"] = "ok" if schema is None else "schema behind"
        if schema is not None:
            problems.append(schema)
    except Exception as e:
        checks["database"] = "unreachable"
        problems.append("database unreachable")
        log.warning("readyz: database unreachable (%s)", describe_db_error(e))
    try:
        _check_broker(request.app.state.celery)
        checks["broker"] = "ok"
    except Exception as e:
        checks["broker"] = "unreachable"
        problems.append("broker unreachable")
        log.warning("readyz: broker unreachable (%s)", describe_broker_error(e))
    if problems:  # the message names what is down
        message = "Not ready: " + "; ".join(problems)
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return error_response(503, message, code="not_ready", headers=headers)
    return JSONResponse({"status": "ok", "checks": checks})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    token: str = request.app.state.settings.metrics_token
    if token:  # a scraper's bearer token (Prometheus: `authorization: {credentials: ...}`)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), token.encode()):
            message = "/metrics needs `Authorization: Bearer <token>` (setting FROMSCRATCH_METRICS_TOKEN)"
            return error_response(
                401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
