"""PostgreSQL faults during a job, on a throwaway cluster this module starts on a free port (never
the machine's own server): a dropped connection during a checkpoint write, a fast shutdown and a
crash (SIGKILL of the postmaster) of ~20 s while a job trains.

In each the job must end `succeeded` in its first attempt (the worker retries its writes and
trains on while the database is away: nothing is trained twice), its metric steps must be 1..N
without a gap or a duplicate, and, while the database is down, the API must answer 503 with a JSON
error (not a 500, not a hang) and /readyz must name the database; both recover without a restart.
Waits poll real conditions; the only sleep is the outage itself; nothing asserts on timings (the
recovery times are printed for the record).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_engine, make_session_factory
from core.keys import verify_key
from core.migrate import run_migrations
from core.models import Job
from core.settings import Settings
from tests.fixtures.infra import PgCluster, _conninfo, init_pg_cluster
from tests.fixtures.service import LiveServer, ServiceProcess, get_job, make_job, wait_until
from tests.worker.helpers import assert_clean_series, event_messages, long_run, metric_rows

OUTAGE_SECONDS = 20.0
pytestmark = pytest.mark.service_settings(
    lease_seconds=4.0, heartbeat_seconds=1.0, reaper_interval_seconds=1.0, db_retry_seconds=90.0
)


# ------------------------------------------------------------------ a database of our own to break
@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PgCluster]:
    try:
        cluster = init_pg_cluster()
    except FileNotFoundError:
        pytest.fail("these tests start their own PostgreSQL: install its server binaries (initdb, pg_ctl)")
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="module")
def fault_db_url(pg_cluster: PgCluster) -> str:
    with psycopg.connect(_conninfo(pg_cluster.url), autocommit=True) as conn:
        conn.execute('CREATE DATABASE "faults"')
    url = pg_cluster.url.rsplit("/", 1)[0] + "/faults"
    run_migrations(url)
    return url


# These two override the suite's fixtures of the same name: the worker, the API server and the key
# (tests/fixtures/service.py) then all use the throwaway cluster.
@pytest.fixture(scope="module")
def session_factory(fault_db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(fault_db_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def settings(fault_db_url: str, redis_url: str, tmp_path: Path, pg_cluster: PgCluster) -> Settings:
    if not _reachable(fault_db_url):  # a failed test may have left it down
        pg_cluster.start()
    return Settings(
        database_url=fault_db_url, broker_url=redis_url, data_dir=tmp_path, blob_backend="db", max_attempts=3
    )


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(_conninfo(url), connect_timeout=3):
            return True
    except psycopg.Error:
        return False


# ------------------------------------------------------------------ helpers
def _job_until(
    session_factory: sessionmaker[Session], job_id: str, ok: Callable[[Job], bool], worker: ServiceProcess
) -> Job:
    """Poll the job row (through outages: an unreachable database is just "not yet")."""

    def check() -> Job | None:
        try:
            job = get_job(session_factory, job_id)
        except Exception:  # the database is down
            return None
        assert job.status not in ("failed", "cancelled"), (job.status, job.error_code, job.error_message)
        return job if ok(job) else None

    return wait_until(check, timeout=240, interval=0.2, message=lambda: f"job {job_id}\n{worker.output()}")


def _assert_trained_once(session_factory: sessionmaker[Session], job_id: str, total: int) -> None:
    """Succeeded in its first attempt, no step trained twice, steps 1..total."""
    job = get_job(session_factory, job_id)
    assert job.status == "succeeded" and job.error_code is None, (job.status, job.error_message)
    assert job.attempts == 1, f"the job was re-run: attempts={job.attempts}"
    messages = event_messages(session_factory, job_id)
    assert not any("re-queued" in m or m.startswith("Resuming") for m in messages), messages
    rows = metric_rows(session_factory, job_id)
    assert_clean_series(rows, total_steps=total)
    assert [m.step for m in rows] == list(range(1, total + 1))


def _assert_quiet_log(worker: ServiceProcess) -> None:
    """One line per component per state change, not a traceback per retry."""
    text = worker.output(tail=2_000_000)
    assert "Traceback" not in text, text[-6000:]
    assert "database unreachable" in text and "database reachable again" in text, text[-6000:]


def _assert_api_down(server: LiveServer, job_id: str) -> None:
    """503 with the JSON envelope and Retry-After, on a kept-alive connection; /readyz names the database."""
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=20) as client:
        for _ in range(2):  # twice on the same connection: the first answer did not close it
            r = client.get(f"/v1/fine_tuning/jobs/{job_id}")
            assert r.status_code == 503, (r.status_code, r.text)
            assert r.json()["error"]["code"] == "database_unavailable", r.text
            assert int(r.headers["retry-after"]) > 0
            assert r.headers.get("connection", "").lower() != "close"
        ready = client.get("/readyz")
    assert ready.status_code == 503, ready.text
    message = ready.json()["error"]["message"]
    assert "database unreachable" in message and "broker" not in message, message


def _api_ready(server: LiveServer, job_id: str) -> bool:
    try:
        ready = httpx.get(f"{server.url}/readyz", timeout=20)
        job = httpx.get(f"{server.url}/v1/fine_tuning/jobs/{job_id}", headers=server.headers(), timeout=20)
    except httpx.HTTPError:
        return False
    return ready.status_code == 200 and job.status_code == 200


# ------------------------------------------------------------------ the scenarios
def test_dropped_connections_during_a_checkpoint_write(
    service_settings: Settings,
    session_factory: sessionmaker[Session],
    worker_proc: ServiceProcess,
    fault_db_url: str,
) -> None:
    total = 60
    job_id = make_job(service_settings, session_factory, train=long_run(total, checkpoint_every=20))
    _job_until(session_factory, job_id, lambda j: j.status == "running", worker_proc)
    # Hold the chunk table so the worker's next checkpoint upload waits inside INSERT INTO
    # blob_chunks, then terminate every connection of the worker: the fault, deterministically.
    with (
        psycopg.connect(_conninfo(fault_db_url)) as holder,
        psycopg.connect(_conninfo(fault_db_url), autocommit=True) as admin,
    ):
        holder.execute("LOCK TABLE blob_chunks IN EXCLUSIVE MODE")

        def upload_waiting() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'INSERT INTO blob_chunks%' AND wait_event_type = 'Lock'"
            ).fetchone()
            return bool(row and row[0])

        wait_until(
            upload_waiting, timeout=120, message=lambda: f"a checkpoint upload\n{worker_proc.output()}"
        )
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s)",
            (holder.info.backend_pid,),
        ).fetchone()
        dropped_at = time.monotonic()
        holder.rollback()
    assert killed and killed[0] >= 1
    step_then = get_job(session_factory, job_id).step
    _job_until(session_factory, job_id, lambda j: j.step > step_then or j.status == "succeeded", worker_proc)
    print(f"\n[dropped connection] the worker wrote again {time.monotonic() - dropped_at:.1f}s after")
    _job_until(session_factory, job_id, lambda j: j.status == "succeeded", worker_proc)
    _assert_trained_once(session_factory, job_id, total)
    assert "database unreachable" in worker_proc.output(tail=2_000_000)


@pytest.mark.parametrize("outage", ["fast_shutdown", "crash"])
def test_database_outage_during_a_job(
    outage: str,
    service_settings: Settings,
    session_factory: sessionmaker[Session],
    worker_proc: ServiceProcess,
    live_server: LiveServer,
    pg_cluster: PgCluster,
) -> None:
    total = 400
    with session_factory() as session:  # the job is the key's owner's, so the API shows it
        key = verify_key(session, live_server.api_key)
        assert key is not None
    train = long_run(total, checkpoint_every=50)
    job_id = make_job(service_settings, session_factory, owner_id=key.owner_id, train=train)
    _job_until(session_factory, job_id, lambda j: j.status == "running" and j.step >= 10, worker_proc)

    down_at = time.monotonic()
    stop: dict[str, Callable[[], Any]] = {"fast_shutdown": pg_cluster.stop, "crash": pg_cluster.crash}
    stop[outage]()
    try:
        _assert_api_down(live_server, job_id)
        time.sleep(max(0.0, down_at + OUTAGE_SECONDS - time.monotonic()))  # the outage itself
    finally:
        pg_cluster.start()
    up_at = time.monotonic()

    wait_until(lambda: _api_ready(live_server, job_id), timeout=60, message=live_server.process.output)
    api_back = time.monotonic() - up_at
    step_then = get_job(session_factory, job_id).step
    _job_until(session_factory, job_id, lambda j: j.step > step_then or j.status == "succeeded", worker_proc)
    print(
        f"\n[{outage}] down {up_at - down_at:.1f}s at step {step_then}; API ready {api_back:.1f}s and "
        f"the worker writing {time.monotonic() - up_at:.1f}s after the restart"
    )
    _job_until(session_factory, job_id, lambda j: j.status == "succeeded", worker_proc)
    _assert_trained_once(session_factory, job_id, total)
    _assert_quiet_log(worker_proc)
