"""One live service for all of tests/e2e: a real `fromscratch worker` subprocess (training), one
`fromscratch worker --queues inference` (completions, on-demand exports; started by the tests that
need it) and a uvicorn API server (`api.main:create_app`), on the test session's real PostgreSQL and Redis.

The fixtures in tests/fixtures/service.py are function-scoped (one worker and server per test);
here they are package-scoped, so the end-to-end and SDK tests share one worker and one server and
pay the process start-up (imports of torch, celery, fastapi) once. The processes are built with
the same helpers, so they read exactly the settings below through `FROMSCRATCH_*`.

The lease is longer than the function-scoped fixtures' 3 s: nothing here kills a worker, and on a
loaded two-core machine a short lease could expire under a healthy worker.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.service import (
    LiveServer,
    ServiceProcess,
    _wait_http_ok,
    api_server_cmd,
    cancel_unfinished_jobs,
    env_from_settings,
    free_port,
    fromscratch_cmd,
    utcnow,
)


@pytest.fixture(scope="package")
def e2e_settings(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from core.settings import Settings

    return Settings(
        database_url=pg_url,
        broker_url=redis_url,
        data_dir=tmp_path_factory.mktemp("e2e-service"),
        blob_backend="db",
        lease_seconds=30,
        heartbeat_seconds=2,
        reaper_interval_seconds=2,
        metrics_flush_seconds=0.5,
        max_attempts=3,
    )


@pytest.fixture(scope="package")
def e2e_worker(e2e_settings: Any, session_factory: Any) -> Iterator[ServiceProcess]:
    """One `fromscratch worker` subprocess for the package. At teardown the jobs created while it
    ran and not finished are cancelled, so no later test's worker picks them up."""
    cancel_unfinished_jobs(session_factory)
    started = utcnow()
    cmd = fromscratch_cmd("worker", "--queues", e2e_settings.worker_queues, "--loglevel", "info")
    log = Path(e2e_settings.data_dir) / "worker.log"
    process = ServiceProcess(cmd=cmd, env=env_from_settings(e2e_settings), log_path=log).start()
    yield process
    process.stop()
    cancel_unfinished_jobs(session_factory, since=started)


@pytest.fixture(scope="package")
def e2e_inference_worker(e2e_settings: Any) -> Iterator[ServiceProcess]:
    """One `fromscratch worker --queues inference` subprocess for the package (completions and
    on-demand exports)."""
    cmd = fromscratch_cmd("worker", "--queues", "inference", "--loglevel", "info")
    log = Path(e2e_settings.data_dir) / "inference-worker.log"
    process = ServiceProcess(cmd=cmd, env=env_from_settings(e2e_settings), log_path=log).start()
    yield process
    process.stop()


@pytest.fixture(scope="package")
def e2e_server(e2e_settings: Any, session_factory: Any, e2e_worker: ServiceProcess) -> Iterator[LiveServer]:
    """uvicorn serving the API on a free port, with a fresh API key of its own owner."""
    from core.keys import create_key

    with session_factory() as session:
        _, secret = create_key(session, "e2e", owner_id=f"owner-e2e-{secrets.token_hex(4)}")
        session.commit()
    port = free_port()
    env = env_from_settings(e2e_settings)
    cmd = api_server_cmd(port)
    process = ServiceProcess(cmd=cmd, env=env, log_path=Path(e2e_settings.data_dir) / "api.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http_ok(f"{url}/healthz", process)
        yield LiveServer(url=url, api_key=secret, env=env, settings=e2e_settings, process=process)
    finally:
        process.stop(timeout=20)


@pytest.fixture(scope="package")
def service_logs(e2e_server: LiveServer, e2e_worker: ServiceProcess) -> Any:
    """A callable returning the tail of both processes' logs (for failure messages)."""

    def logs() -> str:
        return f"{e2e_worker.output()}\n{e2e_server.process.output()}"

    return logs
