"""The FastAPI application: `create_app(settings=None)` (uvicorn: `--factory api.main:create_app`).

State on `app.state`: `settings`, `engine`, `session_factory`, `blobstore`, `celery`, plus
`registry` (Prometheus), `rate_limiter` (requests per key, api/rate_limit.py), `api_routes` (the
routes of the routers below: api/openapi.py documents them, api/errors.py answers a 405 with their
methods). No model is ever loaded here: completions run in the inference workers.

Routers, one per resource: files, jobs (+ presets), statuses, export formats, events (events,
metrics), stream (a job's SSE stream), checkpoints, models (+ content), completions (completions,
chat completions, generate: run by the inference workers, api/inference.py), health (healthz,
readyz, metrics). The dashboard's static files (`api/static/`) are mounted at `/` after the
routers, so every API path wins. Every error is JSON in OpenAI's envelope (api/errors.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles
from prometheus_client import Histogram
from sqlalchemy import Engine
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.db_errors import install_database_error_handler
from api.errors import ERROR_RESPONSES, install_error_handlers
from api.head_requests import HeadAsGetMiddleware
from api.leftovers import sweep_forever
from api.logs import install_api_logging, install_log_redaction
from api.openapi import api_routes, install_openapi
from api.query_params import reject_unknown_query
from api.rate_limit import RateLimiter
from api.request_text import TextURLMiddleware
from api.response_headers import ResponseHeadersMiddleware
from api.routes import (
    checkpoints,
    completions,
    estimates,
    events,
    export_formats,
    files,
    health,
    hyperparameters,
    jobs,
    models,
    statuses,
    stream,
    tensorboard,
    workers,
)
from api.store_errors import install_store_error_handler
from api.stream_limits import StreamLimits
from core.settings import Settings, get_settings

ROUTER_MODULES = (
    health,
    files,
    estimates,
    jobs,
    hyperparameters,
    statuses,
    export_formats,
    events,
    stream,
    checkpoints,
    tensorboard,
    models,
    completions,
    workers,
)
STATIC_DIR = Path(__file__).resolve().parent / "static"
API_DESCRIPTION = """Train small LLaMA models from scratch through an OpenAI-compatible fine-tuning API.

Authenticate with `Authorization: Bearer <key>`. Errors are `{"error": {message, type, param, code}}`."""


class LatencyMiddleware:
    """Pure ASGI middleware (streams pass through untouched) observing the time to the response
    start per (method, route template, status)."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        observed = False

        def observe(status: int) -> None:
            nonlocal observed
            if observed:
                return
            observed = True
            route = scope.get("route")
            path = getattr(route, "path", None)
            if path is None:
                path = "static" if status < 400 else "<unmatched>"
            self.histogram.labels(scope.get("method", ""), path, str(status)).observe(
                time.perf_counter() - start
            )

        async def wrapped_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                observe(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, wrapped_send)
        except Exception:
            observe(500)
            raise


def create_app(settings: Settings | None = None) -> FastAPI:
    from core.blobstore import blobstore_from_settings
    from core.broker import make_celery
    from core.db import make_engine, make_session_factory

    settings = settings or get_settings()
    # Sync endpoints and the teardown of their session dependency both run in anyio's threadpool
    # (40 threads). A pool smaller than that deadlocks under load: every thread waits for a
    # connection while the threads that would return one wait for a free thread. So the pool
    # may grow past the threadpool; idle connections above pool_size are closed again.
    engine_kwargs: dict[str, Any] = {"pool_size": 10, "max_overflow": 50, "pool_timeout": 10}
    engine = make_engine(settings.database_url, **engine_kwargs)
    session_factory = make_session_factory(engine)
    celery = make_celery(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # what a killed API or worker left (temp uploads, incomplete blobs): now and periodically
        sweeper = asyncio.create_task(sweep_forever(settings, app.state.blobstore, session_factory))
        yield
        sweeper.cancel()
        engine.dispose()

    app = FastAPI(
        title="fromscratch",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        responses=ERROR_RESPONSES,
    )
    app.state.settings = settings
    app.state.stream_limits = StreamLimits(settings)  # streams' share of the API (api/stream_limits.py)
    app.state.engine = engine
    app.state.session_factory = session_factory
    app.state.blobstore = blobstore_from_settings(settings, session_factory)
    app.state.celery = celery
    app.state.rate_limiter = RateLimiter.from_settings(settings)
    registry, latency = health.make_registry(session_factory, settings.lease_seconds)
    app.state.registry = registry

    _install_handlers_and_middleware(app, engine, latency)
    install_store_error_handler(app, settings)  # 503 while the S3 server is down
    routers = [module.router for module in ROUTER_MODULES]
    for router in routers:
        app.include_router(router, dependencies=[Depends(reject_unknown_query)])
    app.state.api_routes = list(api_routes(routers))  # for 405's Allow (api/errors.py)
    install_openapi(app, routers)
    if STATIC_DIR.is_dir():
        app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="dashboard")
    return app


def _install_handlers_and_middleware(app: FastAPI, engine: Engine, latency: Histogram) -> None:
    install_error_handlers(app)
    install_database_error_handler(app, engine)  # 503 while the database is down
    install_log_redaction()
    install_api_logging()
    app.add_middleware(TextURLMiddleware)  # a URL holding NUL is a 400 (api/request_text.py)
    app.add_middleware(LatencyMiddleware, histogram=latency)
    app.add_middleware(HeadAsGetMiddleware)  # HEAD on GET routes: their head, no body
    app.add_middleware(ResponseHeadersMiddleware)  # outermost: x-request-id, x-should-retry, Retry-After
