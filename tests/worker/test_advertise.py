"""Workers advertise what they have (worker/advertise.py, issue 12): a real `fromscratch worker`
inserts its `workers` row when it starts (queues, device kind and count, memory of one device),
keeps it fresh, deletes rows of workers gone silent, and removes its own when it stops.
`GET /v1/workers` lists the fresh rows (auth required, whether each is busy)."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from api.main import create_app
from core.keys import create_key
from core.models import Worker, utcnow
from core.settings import Settings
from tests.fixtures.service import ServiceProcess, make_job, wait_for_status, wait_until


def row_of(session_factory: Any, worker_id: str) -> Worker | None:
    with session_factory() as s:
        return s.get(Worker, worker_id)


def listed(client: TestClient, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    r = client.get("/v1/workers", headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    return {w["id"]: w for w in body["data"]}


def test_a_worker_advertises_itself_and_is_listed(
    settings: Settings, session_factory: Any, worker_proc: ServiceProcess
) -> None:
    worker_id = f"fromscratch-{worker_proc.pid}@{socket.gethostname()}"
    row = wait_until(lambda: row_of(session_factory, worker_id), message=worker_proc.output)
    assert (row.queues, row.device_kind, row.devices) == (["cpu"], "cpu", 1)
    assert row.memory_bytes is not None and row.memory_bytes > 0
    first_seen = row.seen_at
    wait_until(
        lambda: (r := row_of(session_factory, worker_id)) is not None and r.seen_at > first_seen,
        message="a refreshed seen_at",
    )
    # a worker that died without a word: its row is dropped by a live worker's next beat
    with session_factory() as s:
        s.add(
            Worker(
                id="dead@nowhere",
                host="nowhere",
                pid=1,
                queues=["gpu"],
                device_kind="cuda",
                devices=8,
                started_at=utcnow() - timedelta(hours=1),
                seen_at=utcnow() - timedelta(seconds=settings.lease_seconds * 3),
            )
        )
        s.commit()
    with session_factory() as s:
        _, secret = create_key(s, "workers")
        s.commit()
    headers = {"Authorization": f"Bearer {secret}"}
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/workers").status_code == 401
        workers = listed(client, headers)
        assert "dead@nowhere" not in workers  # stale rows are never listed
        mine = workers[worker_id]
        assert mine["object"] == "worker" and mine["queues"] == ["cpu"] and mine["devices"] == 1
        assert mine["device_kind"] == "cpu" and mine["memory_bytes"] == row.memory_bytes
        assert mine["busy"] is False and mine["seen_at"] >= mine["started_at"]
        assert not set(mine) & {"host", "pid", "owner_id", "job_id"}
        wait_until(lambda: row_of(session_factory, "dead@nowhere") is None, message="the stale row deleted")

        job_id = make_job(settings, session_factory, train={"max_steps": 100_000})
        wait_for_status(session_factory, job_id, "running", diagnostics=worker_proc.output)
        assert listed(client, headers)[worker_id]["busy"] is True

    worker_proc.stop()
    assert row_of(session_factory, worker_id) is None  # a worker that stops removes its row


def test_advertising_on_the_embedded_sqlite_database(
    sqlite_settings: Settings, sqlite_session_factory: Any
) -> None:
    from worker.advertise import Advertiser

    now = utcnow()
    me = Worker(
        id="w1@box", host="box", pid=7, queues=["gpu.2", "gpu"], device_kind="cuda", devices=2, started_at=now
    )
    advertiser = Advertiser(
        sqlite_session_factory, me, interval=60, stale_after=sqlite_settings.lease_seconds
    )
    advertiser.beat()
    advertiser.beat()  # an upsert: still one row
    with sqlite_session_factory() as s:
        _, secret = create_key(s, "workers")
        s.commit()
    with TestClient(create_app(sqlite_settings)) as client:
        workers = listed(client, {"Authorization": f"Bearer {secret}"})
        assert list(workers) == ["w1@box"]
        assert workers["w1@box"]["queues"] == ["gpu.2", "gpu"] and workers["w1@box"]["devices"] == 2
    advertiser.stop()  # never started: stop still removes the row
    assert row_of(sqlite_session_factory, "w1@box") is None
