"""Placement of a job without a device (issue 23): it trains on the GPU class when a GPU worker is
alive (a fresh `workers` row with a CUDA device), else on the default queue, and admission checks
it against that class's memory. The classes are simulated: a worker row as a GPU worker writes it,
on PostgreSQL and on the embedded SQLite."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete

from api.job_limits import JobTooLarge
from api.main import create_app
from core.models import Worker, utcnow
from core.settings import Settings
from tests.api.test_devices_admission import JOBS, create, new_tenant
from tests.api.test_errors import assert_envelope

GiB = 1 << 30


@contextlib.contextmanager
def gpu_worker(session_factory: Any, seen_at: datetime) -> Iterator[None]:
    """A GPU worker's row, as worker/advertise.py writes it, for the block's duration."""
    worker_id = f"gpu-{secrets.token_hex(4)}@box"
    with session_factory() as s:
        s.add(
            Worker(
                id=worker_id,
                host="box",
                pid=1,
                queues=["gpu"],
                device_kind="cuda",
                devices=1,
                memory_bytes=80 * GiB,
                started_at=seen_at,
                seen_at=seen_at,
            )
        )
        s.commit()
    try:
        yield
    finally:
        with session_factory() as s:
            s.execute(delete(Worker).where(Worker.id == worker_id))
            s.commit()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_a_job_without_a_device_goes_to_the_gpu_class_while_a_gpu_worker_is_alive(
    backend: str, request: pytest.FixtureRequest
) -> None:
    prefix = "" if backend == "postgres" else "sqlite_"
    base: Settings = request.getfixturevalue(f"{prefix}settings")
    session_factory = request.getfixturevalue(f"{prefix}session_factory")
    # a cpu class too small for the job, a gpu class it fits
    settings = base.model_copy(
        update={"cpu_worker_memory_bytes": 1 << 20, "gpu_worker_memory_bytes": 80 * GiB}
    )
    tenant = new_tenant(session_factory)
    with TestClient(create_app(settings)) as client:
        err = assert_envelope(create(client, tenant, {"max_steps": 3}), 400)  # no gpu worker: cpu
        assert err["code"] == JobTooLarge.code and "cpu" in err["message"], err
        with gpu_worker(session_factory, seen_at=utcnow()):
            r = create(client, tenant, {"max_steps": 3})
            assert r.status_code == 200, r.text
            assert r.json()["queue"] == "gpu"
            client.post(f"{JOBS}/{r.json()['id']}/cancel", headers=tenant.headers)
            # a job that names its device keeps it
            err = assert_envelope(create(client, tenant, {"device": "cpu", "max_steps": 3}), 400)
            assert err["code"] == JobTooLarge.code, err
        silent = utcnow() - timedelta(seconds=settings.lease_seconds + 30)
        with gpu_worker(session_factory, seen_at=silent):  # died without saying so
            err = assert_envelope(create(client, tenant, {"max_steps": 3}), 400)
            assert err["code"] == JobTooLarge.code, err
