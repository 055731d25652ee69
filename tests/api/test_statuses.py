"""GET /v1/fine_tuning/statuses: the dashboard's status lists come from core.status through the API;
and the statuses a job shows are true: `queued` while it waits for a worker, the same in REST and SSE."""

from __future__ import annotations

import threading
from typing import Any

from fastapi.testclient import TestClient

from core.status import ACTIVE, CLAIMABLE, TERMINAL, JobStatus
from tests.api.conftest import SHAKESPEARE, Factory, Tenant, upload
from tests.api.test_errors import assert_envelope
from tests.api.test_metrics_stream import JOBS, parse_sse
from tests.fixtures.service import wait_until


def test_statuses_are_served_from_core(client: TestClient, tenant: Tenant) -> None:
    body = client.get("/v1/fine_tuning/statuses", headers=tenant.headers).json()
    assert body["object"] == "fine_tuning.statuses"
    assert body["statuses"] == [s.value for s in JobStatus]
    assert set(body["terminal"]) == set(TERMINAL)
    assert set(body["claimable"]) == set(CLAIMABLE)
    assert set(body["active"]) == set(ACTIVE)


def test_statuses_need_a_key(client: TestClient) -> None:
    assert_envelope(client.get("/v1/fine_tuning/statuses"), 401)


# ------------------------------------------------------------------ true statuses (issue 24)
def _stream(client: TestClient, tenant: Tenant, job_id: str, on_first_status: threading.Event) -> list[Any]:
    """The job's SSE events until the stream ends; `on_first_status` is set at the first status event."""
    got: list[dict[str, Any]] = []
    with client.stream("GET", f"{JOBS}/{job_id}/stream", headers=tenant.headers) as r:
        buf = ""
        for chunk in r.iter_text():
            buf += chunk
            got = parse_sse(buf)
            if any(e["event"] == "status" for e in got):
                on_first_status.set()
    return got


def _status_changes(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (e["event"], e["json"]["data"]["status"] if e["event"] == "message" else e["json"]["status"])
        for e in events
        if e["event"] == "status" or (e["json"].get("data") or {}).get("status")
    ]


def test_stream_status_events_say_what_the_job_says(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    """A client that connects to a running job: its first status event is `running`, as the job it
    embeds and REST say; the statuses the job has left come as message events (its history)."""
    job_id = factory.job(tenant.owner_id, status="queued")
    factory.event(job_id, f"Created fine-tuning job: {job_id}", data={"status": "queued"})
    factory.set_status(job_id, "validating_files")
    factory.set_status(job_id, "running")
    first = threading.Event()

    def cancel_once_seen() -> None:
        first.wait(timeout=60)  # a readiness handshake: the stream has said its first status
        factory.set_status(job_id, "cancelled")

    t = threading.Thread(target=cancel_once_seen)
    t.start()
    try:
        events = _stream(client, tenant, job_id, first)
    finally:
        first.set()
        t.join()
    statuses = [e for e in events if e["event"] == "status"]
    assert statuses[0]["json"]["status"] == "running" and statuses[0]["json"]["job"]["status"] == "running"
    assert all(e["json"]["status"] == e["json"]["job"]["status"] for e in statuses)
    assert _status_changes(events) == [
        ("message", "queued"),
        ("message", "validating_files"),
        ("status", "running"),
        ("status", "cancelled"),
    ]


def test_a_job_behind_another_is_queued_until_a_worker_takes_it(
    client: TestClient, tenant: Tenant, worker_proc: Any, session_factory: Any
) -> None:
    """One worker busy with job A: job B waits `queued` (REST and SSE), not `validating_files`; once A
    ends, the worker takes B: validating_files while it reads the files, then running, then done."""
    from core.jobstates import request_cancel
    from core.models import Job

    fid = upload(client, tenant, SHAKESPEARE.read_bytes(), "shakespeare.txt").json()["id"]
    body: dict[str, Any] = {"model": "llama-tiny", "training_file": fid}
    first = client.post(JOBS, headers=tenant.headers, json={**body, "hyperparameters": {"max_steps": 20000}})
    a = first.json()["id"]
    wait_until(
        lambda: client.get(f"{JOBS}/{a}", headers=tenant.headers).json()["status"] == "running",
        timeout=180,
        message=lambda: f"job A running; worker log:\n{worker_proc.output()}",
    )
    b = client.post(JOBS, headers=tenant.headers, json={**body, "hyperparameters": {"max_steps": 2}}).json()
    assert b["status"] == "queued"
    assert client.get(f"{JOBS}/{b['id']}", headers=tenant.headers).json()["status"] == "queued"
    seen = threading.Event()

    def end_a_once_b_is_seen() -> None:
        seen.wait(timeout=120)
        with session_factory() as s:
            job = s.get(Job, a)
            assert job is not None
            request_cancel(s, job)
            s.commit()

    t = threading.Thread(target=end_a_once_b_is_seen)
    t.start()
    try:
        events = _stream(client, tenant, b["id"], seen)
    finally:
        seen.set()
        t.join()
    statuses = [e for e in events if e["event"] == "status"]
    assert statuses[0]["json"]["status"] == "queued" and statuses[0]["json"]["job"]["status"] == "queued"
    assert all(e["json"]["status"] == e["json"]["job"]["status"] for e in statuses)
    assert statuses[-1]["json"]["status"] == "succeeded", worker_proc.output()
    changes = [status for _, status in _status_changes(events)]
    assert changes[:2] == ["queued", "validating_files"] and changes[-2:] == ["running", "succeeded"]
