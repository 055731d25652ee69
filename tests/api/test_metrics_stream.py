"""Events (OpenAI shape, newest first), metrics (step order, downsampling keeps the last point) and
the SSE stream (resumable with Last-Event-ID), from rows written straight into the database."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import Factory, Tenant
from tests.api.test_errors import assert_envelope

JOBS = "/v1/fine_tuning/jobs"


def test_events_merge_metrics_and_messages_newest_first(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    factory.event(job_id, "Job started", created_at=t0)
    factory.metrics(job_id, range(1, 6), val_every=5, start=t0 + timedelta(seconds=1))
    factory.event(job_id, "Checkpoint saved", created_at=t0 + timedelta(seconds=2))
    body = client.get(f"{JOBS}/{job_id}/events?limit=100", headers=tenant.headers).json()
    kinds = [(e["type"], e["data"]["step"] if e["type"] == "metrics" else e["message"]) for e in body["data"]]
    assert kinds == [
        ("message", "Checkpoint saved"),
        ("metrics", 5),
        ("metrics", 4),
        ("metrics", 3),
        ("metrics", 2),
        ("metrics", 1),
        ("message", "Job started"),
    ]
    newest_metric = body["data"][1]
    assert newest_metric["object"] == "fine_tuning.job.event" and newest_metric["level"] == "info"
    assert newest_metric["data"]["valid_loss"] is not None and newest_metric["data"]["train_loss"] is not None
    assert set(newest_metric["data"]) >= {"step", "train_loss", "valid_loss", "learning_rate", "tokens_per_s"}
    # cursor pagination walks the same order without repeats
    walked: list[str] = []
    after = None
    while True:
        page = client.get(
            f"{JOBS}/{job_id}/events?limit=3" + (f"&after={after}" if after else ""), headers=tenant.headers
        ).json()
        walked += [e["id"] for e in page["data"]]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert walked == [e["id"] for e in body["data"]]


def test_events_filtered_by_type(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    factory.event(job_id, "Job started", created_at=t0)
    factory.metrics(job_id, range(1, 1201), start=t0 + timedelta(seconds=1))
    factory.event(job_id, "Checkpoint saved", created_at=t0 + timedelta(seconds=2))
    url = f"{JOBS}/{job_id}/events"
    # the lifecycle is not buried under 1,200 steps
    messages = client.get(f"{url}?type=message&limit=1000", headers=tenant.headers).json()
    assert [e["message"] for e in messages["data"]] == ["Checkpoint saved", "Job started"]
    assert messages["has_more"] is False
    # and pages on its own cursor
    first = client.get(f"{url}?type=message&limit=1", headers=tenant.headers).json()
    assert first["has_more"] is True
    rest = client.get(f"{url}?type=message&after={first['data'][0]['id']}", headers=tenant.headers).json()
    assert [e["message"] for e in rest["data"]] == ["Job started"]
    steps = client.get(f"{url}?type=metrics&limit=5", headers=tenant.headers).json()
    assert {e["type"] for e in steps["data"]} == {"metrics"} and steps["has_more"] is True
    assert [e["data"]["step"] for e in steps["data"]] == [1200, 1199, 1198, 1197, 1196]
    assert_envelope(client.get(f"{url}?type=log", headers=tenant.headers), 400)


def test_metrics_cursor_limit_and_downsampling(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    factory.metrics(job_id, range(1, 1001), val_every=100)
    url = f"{JOBS}/{job_id}/metrics"
    page = client.get(f"{url}?after_step=10&limit=5", headers=tenant.headers).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [p["step"] for p in page["data"]] == [11, 12, 13, 14, 15]
    assert set(page["data"][0]) >= {"step", "train_loss", "val_loss", "lr", "tokens_per_s", "created_at"}
    tail = client.get(f"{url}?after_step=998", headers=tenant.headers).json()
    assert [p["step"] for p in tail["data"]] == [999, 1000] and tail["has_more"] is False

    down = client.get(f"{url}?max_points=50", headers=tenant.headers).json()
    steps = [p["step"] for p in down["data"]]
    assert 2 <= len(steps) <= 50
    assert steps == sorted(set(steps))
    assert steps[0] == 1 and steps[-1] == 1000  # the first and last points are always kept
    # evaluation rows survive: every bucket that held one keeps it
    assert {p["step"] for p in down["data"] if p["val_loss"] is not None} >= {100, 200, 300, 900, 1000}
    for n in (1, 2, 3, 999, 1000, 5000):
        got = [p["step"] for p in client.get(f"{url}?max_points={n}", headers=tenant.headers).json()["data"]]
        assert len(got) <= n and got[-1] == 1000 and (n == 1 or got[0] == 1), (n, got)
    # downsampling a later window keeps its own last point
    got = client.get(f"{url}?after_step=500&limit=100&max_points=10", headers=tenant.headers).json()
    assert got["data"][-1]["step"] == 600 and len(got["data"]) <= 10 and got["has_more"] is True
    assert got["data"][0]["step"] == 501
    assert_envelope(client.get(f"{url}?max_points=0", headers=tenant.headers), 400)


def parse_sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            fields["json"] = json.loads(fields["data"])
            events.append(fields)
    return events


def test_stream_of_a_finished_job_replays_and_ends(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    factory.metrics(job_id, range(1, 11))
    factory.event(job_id, "Checkpoint saved at step 10")
    factory.set_status(job_id, "succeeded", fine_tuned_model="ft:llama-tiny:x")
    with client.stream("GET", f"{JOBS}/{job_id}/stream", headers=tenant.headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.read().decode())
    metrics = [e for e in events if e["event"] == "metrics"]
    assert [e["json"]["step"] for e in metrics] == list(range(1, 11))
    assert events[-1]["event"] == "status" and events[-1]["json"]["status"] == "succeeded"
    assert events[-1]["json"]["job"]["fine_tuned_model"] == "ft:llama-tiny:x"
    assert any(e["event"] == "message" and "Checkpoint saved" in e["json"]["message"] for e in events)
    assert all("id" in e for e in events)
    assert metrics[-1]["id"].startswith("10.")


def test_stream_resumes_after_last_event_id(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    factory.metrics(job_id, range(1, 6))
    seq = factory.event(job_id, "Checkpoint saved at step 5")
    last_id = f"5.{seq}"
    factory.metrics(job_id, range(6, 9))
    factory.set_status(job_id, "succeeded")
    with client.stream(
        "GET", f"{JOBS}/{job_id}/stream", headers={**tenant.headers, "Last-Event-ID": last_id}
    ) as r:
        events = parse_sse(r.read().decode())
    assert [e["json"]["step"] for e in events if e["event"] == "metrics"] == [6, 7, 8]
    assert not any("Checkpoint saved" in e["data"] for e in events)
    assert events[-1]["event"] == "status" and events[-1]["json"]["status"] == "succeeded"
    # everything seen: a reconnect gets an empty stream that ends
    with client.stream(
        "GET", f"{JOBS}/{job_id}/stream", headers={**tenant.headers, "Last-Event-ID": events[-1]["id"]}
    ) as r:
        assert parse_sse(r.read().decode()) == []
    assert_envelope(
        client.get(f"{JOBS}/{job_id}/stream", headers={**tenant.headers, "Last-Event-ID": "bogus"}), 400
    )


def test_stream_delivers_rows_as_they_arrive(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    got: list[dict[str, Any]] = []
    done = threading.Event()

    def writer() -> None:
        # wait for the first event before writing: a readiness handshake, not a timing assumption
        done.wait(timeout=30)
        factory.metrics(job_id, [1, 2, 3])
        factory.set_status(job_id, "cancelled")

    t = threading.Thread(target=writer)
    t.start()
    try:
        with client.stream("GET", f"{JOBS}/{job_id}/stream", headers=tenant.headers) as r:
            buf = ""
            for chunk in r.iter_text():
                buf += chunk
                got = parse_sse(buf)
                if got:
                    done.set()
    finally:
        done.set()
        t.join()
    assert got[0]["event"] == "status" and got[0]["json"]["status"] == "running"
    assert [e["json"]["step"] for e in got if e["event"] == "metrics"] == [1, 2, 3]
    assert got[-1]["event"] == "status" and got[-1]["json"]["status"] == "cancelled"


def test_checkpoints_openai_shape(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id, model_id = factory.finished_model(tenant.owner_id, steps=(10, 20, 30))
    page = client.get(f"{JOBS}/{job_id}/checkpoints?limit=2", headers=tenant.headers).json()
    assert page["has_more"] is True
    first = page["data"][0]
    assert first["object"] == "fine_tuning.job.checkpoint"
    assert first["step_number"] == 30 and first["fine_tuning_job_id"] == job_id
    assert first["fine_tuned_model_checkpoint"] == f"{model_id}:ckpt-step-30"
    assert (
        first["metrics"]["step"] == 30
        and "train_loss" in first["metrics"]
        and "valid_loss" in first["metrics"]
    )
    rest = client.get(
        f"{JOBS}/{job_id}/checkpoints?after={page['data'][-1]['id']}", headers=tenant.headers
    ).json()
    assert [c["step_number"] for c in rest["data"]] == [10] and rest["has_more"] is False


def test_stream_accepts_api_key_query_for_eventsource(
    client: TestClient, tenant: Tenant, other: Tenant, factory: Factory
) -> None:
    job_id = factory.job(tenant.owner_id, status="cancelled")
    with client.stream("GET", f"{JOBS}/{job_id}/stream?api_key={tenant.secret}") as r:
        assert r.status_code == 200
        assert parse_sse(r.read().decode())[-1]["json"]["status"] == "cancelled"
    assert_envelope(client.get(f"{JOBS}/{job_id}/stream?api_key={other.secret}"), 404)
    assert_envelope(client.get(f"{JOBS}/{job_id}/stream?api_key=fsk-bad"), 401)
    # other routes do not take keys from the URL: the parameter is not theirs
    refused = assert_envelope(client.get(f"{JOBS}/{job_id}?api_key={tenant.secret}"), 400)
    assert refused["param"] == "api_key" and refused["code"] == "unknown_parameter"
