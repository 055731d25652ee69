"""Every error is JSON in OpenAI's envelope, whatever raised it; open routes need no key."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import Tenant

ENVELOPE_KEYS = {"message", "type", "param", "code"}


def assert_envelope(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers["content-type"]
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == ENVELOPE_KEYS, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in response.text
    return body["error"]


def test_unknown_path_is_json_404(client: TestClient, tenant: Tenant) -> None:
    err = assert_envelope(client.get("/v1/nope", headers=tenant.headers), 404)
    assert "/v1/nope" in err["message"]
    assert_envelope(client.get("/definitely/not/here"), 404)


def test_wrong_method_is_json_405(client: TestClient, tenant: Tenant) -> None:
    err = assert_envelope(client.put("/v1/files", headers=tenant.headers), 405)
    assert err["type"] == "invalid_request_error"


def test_bad_body_is_json_400(client: TestClient, tenant: Tenant) -> None:
    """Request validation answers 400 as OpenAI does (not FastAPI's 422), naming the field."""
    r = client.post(
        "/v1/fine_tuning/jobs",
        headers={**tenant.headers, "Content-Type": "application/json"},
        content=b"{not json",
    )
    err = assert_envelope(r, 400)
    assert err["code"] == "validation_error" and "not valid JSON" in err["message"]
    r = client.post("/v1/models/ft:x:y/generate", headers=tenant.headers, json={"max_tokens": "many"})
    err = assert_envelope(r, 400)
    assert err["param"] == "max_tokens" and "max_tokens" in err["message"]
    err = assert_envelope(client.get("/v1/fine_tuning/jobs?limit=101", headers=tenant.headers), 400)
    assert err["param"] == "limit" and "100" in err["message"]
    err = assert_envelope(client.get("/v1/fine_tuning/jobs?status=sleeping", headers=tenant.headers), 400)
    assert err["param"] == "status" and "succeeded" in err["message"]


def test_an_unknown_query_parameter_is_400_naming_it(
    client: TestClient, tenant: Tenant, factory: Any
) -> None:
    """As an unknown body field is: a filter that does not exist would otherwise read as applied."""
    job_id = factory.job(tenant.owner_id)
    for url, name in [
        ("/v1/fine_tuning/jobs?suffix=bs8", "suffix"),
        ("/v1/fine_tuning/jobs?limit=5&sort=val_loss", "sort"),
        (f"/v1/fine_tuning/jobs/{job_id}/metrics?step_gt=10", "step_gt"),
        ("/v1/files?purpose=fine-tune&colour=red", "colour"),
    ]:
        err = assert_envelope(client.get(url, headers=tenant.headers), 400)
        assert err["param"] == name and err["code"] == "unknown_parameter", err
        assert f"Unrecognized query parameter: {name}" in err["message"]
    # what a route declares, its dependencies' (the stream's api_key) and metadata[...] filters pass
    ok = [
        "/v1/fine_tuning/jobs?limit=5&metadata[sweep]=s1",
        f"/v1/fine_tuning/jobs/{job_id}/metrics?max_points=5",
        "/v1/files?purpose=fine-tune",
    ]
    for url in ok:
        assert client.get(url, headers=tenant.headers).status_code == 200, url
    # a wrong method stays a 405, whatever its query (the download's `format` is no DELETE's)
    wrong = client.delete("/v1/models/llama-15m/content?format=gguf&dtype=f32", headers=tenant.headers)
    assert assert_envelope(wrong, 405)["code"] == "method_not_allowed"


def test_a_json_body_sent_as_a_form_is_400_naming_the_content_type(
    client: TestClient, tenant: Tenant
) -> None:
    """curl -d sends application/x-www-form-urlencoded: the answer says what to send instead."""
    body = b'{"model": "llama-tiny", "training_file": "file-nope"}'
    form = {**tenant.headers, "Content-Type": "application/x-www-form-urlencoded"}
    err = assert_envelope(client.post("/v1/fine_tuning/jobs", content=body, headers=form), 400)
    assert err["code"] == "invalid_content_type" and "Content-Type: application/json" in err["message"]
    assert "application/x-www-form-urlencoded" in err["message"]
    bare = assert_envelope(client.post("/v1/fine_tuning/jobs", content=body, headers=tenant.headers), 400)
    assert bare["code"] == "invalid_content_type" and "no Content-Type" in bare["message"]


def test_missing_and_bad_keys_are_401(client: TestClient) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer fsk-wrong"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer "},
    ):
        for method, path in (
            ("get", "/v1/files"),
            ("get", "/v1/fine_tuning/jobs"),
            ("get", "/v1/models"),
            ("post", "/v1/fine_tuning/jobs"),
            ("post", "/v1/files"),
        ):
            err = assert_envelope(getattr(client, method)(path, headers=headers), 401)
            assert err["code"] in ("missing_api_key", "invalid_api_key")


def test_revoked_key_is_401(client: TestClient, tenant: Tenant, session_factory: Any) -> None:
    from core.keys import hash_secret
    from core.models import ApiKey, utcnow

    assert client.get("/v1/files", headers=tenant.headers).status_code == 200
    with session_factory() as s:
        key = s.query(ApiKey).filter_by(key_hash=hash_secret(tenant.secret)).one()
        key.revoked_at = utcnow()
        s.commit()
    assert_envelope(client.get("/v1/files", headers=tenant.headers), 401)


def test_unhandled_exception_is_json_500_without_trace(settings: Any) -> None:
    app = create_app(settings)

    def boom() -> None:
        raise RuntimeError("secret internals")

    app.add_api_route("/boom", boom)
    app.router.routes.insert(0, app.router.routes.pop())  # before the dashboard's mount at /

    with TestClient(app, raise_server_exceptions=False) as c:
        err = assert_envelope(c.get("/boom"), 500)
    assert err["type"] == "server_error"
    assert "secret internals" not in err["message"]


def test_open_routes_need_no_key(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}
    assert client.get("/docs").status_code == 200
    assert client.get("/openapi.json").json()["info"]["title"] == "fromscratch"
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert "fromscratch_jobs" in metrics.text


def test_readyz_503_when_broker_unreachable(settings: Any) -> None:
    bad = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(bad)) as c:
        err = assert_envelope(c.get("/readyz"), 503)
    assert "broker" in err["message"]


def test_readyz_503_until_the_schema_is_this_codes(sqlite_settings: Any) -> None:
    """An API started before `fromscratch migrate` (or before an upgrade's) is not ready: every
    route would answer 500. The message says what to run."""
    from core.migrate import downgrade, head_revision, run_migrations

    url = sqlite_settings.database_url
    downgrade(url, "base")  # as before the first `migrate`
    with TestClient(create_app(sqlite_settings)) as c:
        err = assert_envelope(c.get("/readyz"), 503)
        assert "the database has no schema: run `fromscratch migrate`" in err["message"]
        run_migrations(url)
        assert c.get("/readyz").status_code == 200
        downgrade(url, "-1")
        err = assert_envelope(c.get("/readyz"), 503)
        assert f"this code needs {head_revision()}: run `fromscratch migrate`" in err["message"]
        run_migrations(url)
        assert c.get("/readyz").json()["checks"]["database"] == "ok"


def test_metrics_behind_a_token_when_one_is_set(settings: Any) -> None:
    """Its labels name every tenant's running jobs: a deployment can keep it to its scraper."""
    with TestClient(create_app(settings.model_copy(update={"metrics_token": "scrape-me"}))) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic scrape-me"}):
            err = assert_envelope(c.get("/metrics", headers=headers), 401)
            assert "FROMSCRATCH_METRICS_TOKEN" in err["message"], err
        r = c.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert r.status_code == 200 and "fromscratch_jobs" in r.text
        assert c.get("/healthz").status_code == 200  # the probes stay open


def test_request_latency_and_job_gauges_exported(client: TestClient, tenant: Tenant, factory: Any) -> None:
    factory.job(tenant.owner_id, status="running", tokens_per_s=1234.0)
    client.get("/v1/files", headers=tenant.headers)
    text = client.get("/metrics").text
    assert (
        'fromscratch_http_request_duration_seconds_count{method="GET",route="/v1/files",status="200"}' in text
    )
    running = [line for line in text.splitlines() if line.startswith('fromscratch_jobs{status="running"}')]
    assert running and float(running[0].split()[-1]) >= 1
    assert "fromscratch_queue_depth" in text
    assert "fromscratch_training_tokens_per_second{" in text
