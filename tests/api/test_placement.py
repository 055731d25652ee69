"""Placement of a job without a device (issue 23): it trains on the GPU class when a GPU worker is
alive (a fresh `workers` row with a CUDA device), else on the default queue, and admission checks
it against that class's memory. A job naming cuda is refused where only CPU workers consume the
gpu queue, and waits where none does. The classes are simulated: a worker row as a GPU worker writes it,
on PostgreSQL and on the embedded SQLite."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, update

from api.job_limits import JobTooLarge
from api.main import create_app
from core.models import Job, Worker, utcnow
from core.settings import Settings
from tests.api.test_devices_admission import JOBS, create, new_tenant
from tests.api.test_errors import assert_envelope

GiB = 1 << 30


@contextlib.contextmanager
def gpu_worker(
    session_factory: Any, seen_at: datetime, device_kind: str = "cuda", queue: str = "gpu"
) -> Iterator[None]:
    """A gpu-queue training worker's row, as worker/advertise.py writes it, for the block's
    duration: one with a GPU, or (device_kind cpu) a CPU worker consuming the gpu queue too (or,
    given `queue`, another queue)."""
    worker_id = f"gpu-{secrets.token_hex(4)}@box"
    with session_factory() as s:
        s.add(
            Worker(
                id=worker_id,
                host="box",
                pid=1,
                queues=[queue],
                device_kind=device_kind,
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


def test_a_cuda_job_is_refused_where_the_gpu_queues_workers_have_no_gpu_and_waits_where_there_are_none(
    sqlite_settings: Settings, sqlite_session_factory: Any
) -> None:
    """`fromscratch serve` on a laptop: its one training worker consumes the gpu queue on a CPU, and
    a job naming cuda used to be accepted there and then fail. (The embedded database: the shared
    Postgres may hold other tests' live workers.)"""
    tenant = new_tenant(sqlite_session_factory)
    cuda = {"device": "cuda", "max_steps": 3}
    with TestClient(create_app(sqlite_settings)) as client:
        r = create(client, tenant, cuda)  # no gpu worker seen: GPU nodes may still be starting
        assert r.status_code == 200 and r.json()["queue"] == "gpu", r.text
        client.post(f"{JOBS}/{r.json()['id']}/cancel", headers=tenant.headers)
        with gpu_worker(sqlite_session_factory, seen_at=utcnow(), device_kind="cpu"):
            err = assert_envelope(create(client, tenant, cuda), 400)
            assert err["param"] == "device" and "no CUDA device" in err["message"], err
            assert create(client, tenant, {"max_steps": 3}).json()["queue"] == "cpu"  # auto: the CPU
            with gpu_worker(sqlite_session_factory, seen_at=utcnow()):  # and a GPU one beside it
                r = create(client, tenant, cuda)
                assert r.status_code == 200 and r.json()["queue"] == "gpu", r.text


def test_a_waiting_job_says_why_it_cannot_start(
    sqlite_settings: Settings, sqlite_session_factory: Any
) -> None:
    """A job on a queue no live worker consumes used to wait without a word; so did one held back
    by its key's max_running_jobs_per_key. `waiting_for` says which, until it no longer holds."""
    settings = sqlite_settings.model_copy(update={"max_running_jobs_per_key": 1})
    tenant = new_tenant(sqlite_session_factory)
    with TestClient(create_app(settings)) as client:
        r = create(client, tenant, {"device": "cuda", "max_steps": 3})
        job_id = r.json()["id"]
        assert "no live worker consumes queue 'gpu'" in r.json()["waiting_for"], r.text
        listed = client.get(JOBS, headers=tenant.headers).json()["data"]
        assert listed[0]["waiting_for"] == r.json()["waiting_for"]
        assert 'fromscratch_workers{device_kind="cuda"' not in client.get("/metrics").text
        with gpu_worker(sqlite_session_factory, seen_at=utcnow()):
            assert client.get(f"{JOBS}/{job_id}", headers=tenant.headers).json()["waiting_for"] is None
            assert 'fromscratch_workers{device_kind="cuda",queue="gpu"} 1.0' in client.get("/metrics").text
            other = create(client, tenant, {"device": "cuda", "max_steps": 3}).json()["id"]
            with sqlite_session_factory() as s:  # a worker claimed the first: the key's one slot
                s.execute(update(Job).where(Job.id == job_id).values(lease_owner="box:1:1"))
                s.commit()
            waiting = client.get(f"{JOBS}/{other}", headers=tenant.headers).json()["waiting_for"]
            assert "max_running_jobs_per_key (1)" in waiting, waiting
            assert client.get(f"{JOBS}/{job_id}", headers=tenant.headers).json()["waiting_for"] is None
        # the gpu worker is gone (its row with it): the second job waits for one again
        assert "queue 'gpu'" in client.get(f"{JOBS}/{other}", headers=tenant.headers).json()["waiting_for"]
