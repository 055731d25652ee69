"""The SSE stream and the metrics under hostile or unlucky requests (issue 9): cursors beyond any
column answer 400 or nothing, never a traceback mid-stream; a revoked key closes the streams it
opened; a metric row that gains its val_loss after its train_loss was sent is not missed."""

from __future__ import annotations

import threading
from typing import Any

from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import Factory, Tenant
from tests.api.test_errors import assert_envelope
from tests.api.test_metrics_stream import parse_sse

JOBS = "/v1/fine_tuning/jobs"


# ----------------------------------------------------------------------------- 64-bit integers
def test_metrics_after_step_is_bounded_to_64_bits(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    factory.metrics(job_id, range(1, 4))
    url = f"{JOBS}/{job_id}/metrics"
    for value in (2**63, -(2**63) - 1, 10**30):
        err = assert_envelope(client.get(url, params={"after_step": value}, headers=tenant.headers), 400)
        assert err["param"] == "after_step"
    for value, steps in ((2**63 - 1, []), (-(2**63), [1, 2, 3]), (1, [2, 3])):
        r = client.get(url, params={"after_step": value}, headers=tenant.headers)
        assert r.status_code == 200 and [p["step"] for p in r.json()["data"]] == steps
    # an event cursor naming a step past any column is just not an id of this list
    for step in ("9" * 12, "9" * 30):
        after = f"ftevent-{job_id.split('-', 1)[1]}-s{step}"
        err = assert_envelope(
            client.get(f"{JOBS}/{job_id}/events", params={"after": after}, headers=tenant.headers), 400
        )
        assert err["param"] == "after"


def test_stream_refuses_an_oversized_last_event_id_before_it_starts(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    job_id = factory.job(tenant.owner_id, status="cancelled")
    url = f"{JOBS}/{job_id}/stream"
    for value in ("99999999999999999999.0", "1.99999999999999999999", "1e5.0"):
        err = assert_envelope(client.get(url, headers={**tenant.headers, "Last-Event-ID": value}), 400)
        assert err["param"] == "Last-Event-ID"
        err = assert_envelope(client.get(url, params={"last_event_id": value}, headers=tenant.headers), 400)
        assert err["param"] == "last_event_id"
    # the largest id the pattern allows resumes past everything: the stream ends at once
    biggest = "999999999999999999.999999999999999999"
    with client.stream("GET", url, headers={**tenant.headers, "Last-Event-ID": biggest}) as r:
        assert r.status_code == 200 and parse_sse(r.read().decode()) == []


# ----------------------------------------------------------------------------------- the stream
def test_stream_closes_when_its_key_is_revoked(settings: Any, tenant: Tenant, factory: Factory) -> None:
    from core.keys import hash_secret
    from core.models import ApiKey, utcnow

    job_id = factory.job(tenant.owner_id, status="running")
    app = create_app(settings.model_copy(update={"stream_key_recheck_seconds": 0.2}))
    revoked = threading.Event()

    def revoke() -> None:
        with factory.sf() as s:
            key = s.query(ApiKey).filter_by(key_hash=hash_secret(tenant.secret)).one()
            key.revoked_at = utcnow()
            s.commit()
        revoked.set()

    with (
        TestClient(app) as client,
        client.stream("GET", f"{JOBS}/{job_id}/stream", headers=tenant.headers) as r,
    ):
        buf = ""
        for chunk in r.iter_text():  # ends when the server closes the stream
            buf += chunk
            if parse_sse(buf) and not revoked.is_set():
                revoke()
    events = parse_sse(buf)
    assert revoked.is_set() and events[-1]["event"] == "error", events
    assert events[-1]["json"]["error"]["code"] == "invalid_api_key"


def test_stream_sends_a_row_that_gains_its_val_loss_after_its_train_loss(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    """The worker upserts rows by step: an evaluation fills `val_loss` of a row whose train_loss
    is already stored. The stream used to send that row at once and then, its cursor past the
    step, never again: the chart missed the validation point (the browser test's 5 of 6)."""
    from worker.metric_rows import upsert_metrics

    job_id = factory.job(tenant.owner_id, status="running")
    with factory.sf() as s:  # steps 1..3 logged; step 3 is an evaluation step, not evaluated yet
        upsert_metrics(s, job_id, {step: {"train_loss": 5.0 - step / 10} for step in (1, 2, 3)})
        s.commit()
    got: list[dict[str, Any]] = []
    first_batch = threading.Event()

    def worker() -> None:
        first_batch.wait(timeout=30)  # a handshake: the stream has sent what it had
        with factory.sf() as s:
            upsert_metrics(s, job_id, {3: {"val_loss": 4.5}, 4: {"train_loss": 4.6}})
            s.commit()
        factory.set_status(job_id, "succeeded")

    t = threading.Thread(target=worker)
    t.start()
    try:
        with client.stream("GET", f"{JOBS}/{job_id}/stream", headers=tenant.headers) as r:
            buf = ""
            for chunk in r.iter_text():
                buf += chunk
                got = parse_sse(buf)
                if any(e["event"] == "metrics" and e["json"]["step"] == 2 for e in got):
                    first_batch.set()
    finally:
        first_batch.set()
        t.join()
    metrics = [e["json"] for e in got if e["event"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # every step once, in order
    assert metrics[2]["val_loss"] == 4.5, metrics[2]
    assert got[-1]["event"] == "status" and got[-1]["json"]["status"] == "succeeded"
