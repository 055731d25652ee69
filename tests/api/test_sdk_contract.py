"""What the official openai SDK and its users rely on, through the real app in a TestClient
(PostgreSQL, Redis; SQLite for the metadata filter too): the results file via `files.content`,
`jobs.list(metadata=...)`, cancel/pause answers, and the headers — `x-request-id` everywhere,
`x-should-retry: false` where a retry cannot help, `Retry-After` on 429/503 — with the SDK's own
retry logic counted request by request. (With a real worker: tests/worker/test_sdk_live.py.)"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.errors import APIError
from api.main import create_app
from core.jobstates import transition
from core.keys import create_key
from core.models import Job
from core.settings import Settings
from tests.api.conftest import Factory, Tenant, upload
from tests.api.test_errors import assert_envelope
from worker.result_file import HEADER, write_result_file

JOBS = "/v1/fine_tuning/jobs"
GENERATED_ID = re.compile(r"req_[0-9a-f]{32}")
BIG = b'"' + b"x" * (2 << 20) + b'"'  # a JSON body past the 1 MiB limit


def sdk_for(client: TestClient, secret: str, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=secret, http_client=client, max_retries=max_retries
    )


class RequestCounter:
    """Counts the requests a client sends (the SDK's retries included), by path."""

    def __init__(self, client: TestClient) -> None:
        self.paths: list[str] = []
        client.event_hooks = {
            "request": [lambda request: self.paths.append(request.url.path)],
            "response": [],
        }

    def count(self, path: str) -> int:
        return self.paths.count(path)


@pytest.fixture
def client_with(settings: Settings) -> Iterator[Any]:
    """client_with(**settings changes) -> a TestClient of the app with those settings."""
    clients: list[TestClient] = []

    def make(**changes: Any) -> TestClient:
        client = TestClient(create_app(type(settings)(**{**settings.model_dump(), **changes})))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


# ------------------------------------------------------------------------------------ result file
def succeed_with_results(factory: Factory, job_id: str) -> None:
    """What the worker's finishing transaction does (worker/job_run.py)."""
    with factory.sf() as s:
        job = s.get(Job, job_id)
        assert job is not None
        transition(s, job, "succeeded", fine_tuned_model=f"ft:llama-tiny:{job_id.split('-')[1]}")
        write_result_file(s, factory.store, job)
        s.commit()


def test_results_csv_through_the_sdk(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    sdk = sdk_for(client, tenant.secret)
    job_id = factory.job(tenant.owner_id, status="running", lease_owner="worker-x")
    factory.metrics(job_id, range(1, 31), val_every=10)
    assert sdk.fine_tuning.jobs.retrieve(job_id).result_files == []
    succeed_with_results(factory, job_id)

    job = sdk.fine_tuning.jobs.retrieve(job_id)
    assert job.status == "succeeded" and len(job.result_files) == 1
    file_id = job.result_files[0]
    content = sdk.files.content(file_id)
    assert content.response.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(content.text)))
    assert tuple(rows[0]) == HEADER
    assert [int(r[0]) for r in rows[1:]] == list(range(1, 31))
    assert [r[3] != "" for r in rows[1:]] == [step % 10 == 0 for step in range(1, 31)]

    meta = sdk.files.retrieve(file_id)
    assert (meta.purpose, meta.filename, meta.bytes) == (
        "fine-tune-results",
        f"{job_id}-results.csv",
        len(content.content),
    )
    assert meta.model_extra is not None and meta.model_extra["format"] == "csv"
    assert file_id in [f.id for f in sdk.files.list()]
    assert [f.id for f in sdk.files.list(purpose="fine-tune-results")] == [file_id]
    # not training data
    err = assert_envelope(
        client.post(JOBS, headers=tenant.headers, json={"model": "llama-tiny", "training_file": file_id}), 400
    )
    assert err["param"] == "training_file"

    assert sdk.files.delete(file_id).deleted is True  # the job no longer names it
    assert sdk.fine_tuning.jobs.retrieve(job_id).result_files == []
    with pytest.raises(openai.NotFoundError):
        sdk.files.content(file_id)


# ------------------------------------------------------------------------------- metadata filter
def check_metadata_filter(client: TestClient, secret: str, factory: Factory, owner: str) -> None:
    sdk = sdk_for(client, secret)
    made = {
        "a": factory.job(owner, status="queued", user_metadata={"team": "nlp", "run": "1"}),
        "b": factory.job(owner, status="queued", user_metadata={"team": "nlp", "run": "2"}),
        "c": factory.job(owner, status="queued", user_metadata={"team": "cv"}),
        "d": factory.job(owner, status="queued", user_metadata=None),
        "e": factory.job(owner, status="queued", user_metadata={}),
        "f": factory.job(owner, status="queued", user_metadata={'odd "key"': "x y&z=[1]"}),
    }
    newest_first = [made[k] for k in "fedcba"]

    def listed(metadata: Any = None, **extra: Any) -> list[str]:
        kwargs = {"metadata": metadata} if metadata is not None else {}
        # limit=1: the SDK's auto-paging follows `after` through the filtered list one job at a time
        return [j.id for j in sdk.fine_tuning.jobs.list(limit=1, **kwargs, **extra)]

    assert listed() == newest_first
    assert listed({"team": "nlp"}) == [made["b"], made["a"]]
    assert listed({"team": "nlp", "run": "2"}) == [made["b"]]
    assert listed({'odd "key"': "x y&z=[1]"}) == [made["f"]]
    assert listed({"team": "nobody"}) == []
    assert listed(extra_query={"metadata": "null"}) == [made["e"], made["d"]]
    page = client.get(
        f"{JOBS}?metadata[team]=nlp&limit=1", headers={"Authorization": f"Bearer {secret}"}
    ).json()
    assert [j["id"] for j in page["data"]] == [made["b"]] and page["has_more"] is True

    auth = {"Authorization": f"Bearer {secret}"}
    too_many = "&".join(f"metadata[k{i}]=v" for i in range(17))
    for query, param in [
        (too_many, "metadata[k16]"),
        ("metadata=nlp", "metadata"),
        (f"metadata[{'k' * 65}]=v", f"metadata[{'k' * 65}]"),
        (f"metadata[k]={'v' * 513}", "metadata[k]"),
        ("metadata[k]=1&metadata[k]=2", "metadata[k]"),
        ("metadata=null&metadata[k]=v", "metadata"),
        ("metadata[a][b]=v", "metadata[a][b]"),  # nested: metadata values are strings
    ]:
        r = client.get(f"{JOBS}?{query}", headers=auth)
        assert assert_envelope(r, 400)["param"] == param, query
        assert r.headers["x-should-retry"] == "false"


def test_jobs_list_metadata_filter_on_postgres(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    check_metadata_filter(client, tenant.secret, factory, tenant.owner_id)


def test_jobs_list_metadata_filter_on_sqlite(
    sqlite_settings: Settings, sqlite_session_factory: sessionmaker[Session]
) -> None:
    with sqlite_session_factory() as s:
        key, secret = create_key(s, "sqlite")
        s.commit()
    with TestClient(create_app(sqlite_settings)) as c:
        check_metadata_filter(c, secret, Factory(sqlite_settings, sqlite_session_factory), key.owner_id)


# --------------------------------------------------------------------------------- cancel / pause
def test_cancel_and_pause_answers(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    sdk = sdk_for(client, tenant.secret)
    running = factory.job(tenant.owner_id, status="running", lease_owner="worker-x")
    job = sdk.fine_tuning.jobs.pause(running)
    assert (
        job.status == "running" and job.model_extra is not None and job.model_extra["pause_requested"] is True
    )
    assert sdk.fine_tuning.jobs.retrieve(running).model_extra["pause_requested"] is True  # type: ignore[index]
    job = sdk.fine_tuning.jobs.resume(running)  # before the worker paused: the request is withdrawn
    assert job.status == "running" and job.model_extra["pause_requested"] is False  # type: ignore[index]
    sdk.fine_tuning.jobs.pause(running)
    factory.set_status(running, "paused")  # the worker saved a checkpoint and stopped
    job = sdk.fine_tuning.jobs.retrieve(running)
    assert job.status == "paused" and job.model_extra["pause_requested"] is False  # type: ignore[index]

    held = factory.job(tenant.owner_id, status="running", lease_owner="worker-y")
    assert sdk.fine_tuning.jobs.cancel(held).status == "cancelled"
    assert sdk.fine_tuning.jobs.retrieve(held).status == "cancelled"
    assert [j.status for j in sdk.fine_tuning.jobs.list() if j.id == held] == ["cancelled"]


# ---------------------------------------------------------------------------------------- headers
def test_request_id_on_every_answer(app: Any, client: TestClient, tenant: Tenant, factory: Factory) -> None:
    ok = client.get("/v1/files", headers=tenant.headers)
    assert ok.status_code == 200 and GENERATED_ID.fullmatch(ok.headers["x-request-id"])
    assert (
        client.get("/v1/files", headers=tenant.headers).headers["x-request-id"] != ok.headers["x-request-id"]
    )
    echoed = client.get("/v1/files", headers={**tenant.headers, "X-Request-Id": "trace-42.a:b/c+d=e"})
    assert echoed.headers["x-request-id"] == "trace-42.a:b/c+d=e"
    for insane in ("has space", "x" * 129, "semi;colon", ""):
        r = client.get("/v1/files", headers={**tenant.headers, "X-Request-Id": insane})
        assert GENERATED_ID.fullmatch(r.headers["x-request-id"]), insane

    missing = client.get(f"{JOBS}/ftjob-nope", headers=tenant.headers)
    assert missing.status_code == 404 and GENERATED_ID.fullmatch(missing.headers["x-request-id"])
    static = client.get("/")
    assert static.status_code == 200 and GENERATED_ID.fullmatch(static.headers["x-request-id"])
    assert GENERATED_ID.fullmatch(client.get("/healthz").headers["x-request-id"])

    job_id = factory.job(tenant.owner_id, status="queued")
    client.post(f"{JOBS}/{job_id}/cancel", headers=tenant.headers)
    with client.stream("GET", f"{JOBS}/{job_id}/stream", headers=tenant.headers) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        assert GENERATED_ID.fullmatch(stream.headers["x-request-id"])
        assert "cancelled" in stream.read().decode()

    def boom() -> None:
        raise RuntimeError("a bug")

    def busy() -> None:
        raise APIError(503, "busy", code="busy")

    app.router.routes.insert(0, APIRoute("/test-boom", boom))
    app.router.routes.insert(0, APIRoute("/test-busy", busy))
    with TestClient(app, raise_server_exceptions=False) as raw:
        crashed = raw.get("/test-boom", headers={"X-Request-Id": "trace-500"})
        assert crashed.status_code == 500 and crashed.headers["x-request-id"] == "trace-500"
        unavailable = raw.get("/test-busy")
        assert unavailable.status_code == 503 and unavailable.headers["retry-after"] == "5"
        assert "x-should-retry" not in unavailable.headers and GENERATED_ID.fullmatch(
            unavailable.headers["x-request-id"]
        )


def test_should_retry_false_where_a_retry_cannot_help(
    client: TestClient, tenant: Tenant, client_with: Any
) -> None:
    answers = [
        (400, client.get(f"{JOBS}?limit=0", headers=tenant.headers)),
        (401, client.get("/v1/files")),
        (404, client.get(f"{JOBS}/ftjob-nope", headers=tenant.headers)),
        (404, client.get("/v1/no-such-route", headers=tenant.headers)),
        (405, client.put("/v1/files", headers=tenant.headers)),
        (413, client.post(JOBS, headers={**tenant.headers, "Content-Type": "application/json"}, content=BIG)),
    ]
    for status, r in answers:
        assert r.status_code == status, (status, r.text)
        assert r.headers["x-should-retry"] == "false", status
        assert GENERATED_ID.fullmatch(r.headers["x-request-id"]), status
    ok = client.get("/v1/files", headers=tenant.headers)
    assert "x-should-retry" not in ok.headers

    quota = upload(client_with(max_stored_bytes_per_key=10), tenant, b"hello world\n" * 10)
    assert assert_envelope(quota, 429)["code"] == "quota_exceeded"
    assert quota.headers["x-should-retry"] == "false" and int(quota.headers["retry-after"]) >= 1

    limited = client_with(rate_limit="1/minute")
    limited.get("/v1/files", headers=tenant.headers)
    throttled = limited.get("/v1/files", headers=tenant.headers)
    assert assert_envelope(throttled, 429)["code"] == "rate_limit_exceeded"
    assert "x-should-retry" not in throttled.headers and 1 <= int(throttled.headers["retry-after"]) <= 60


def test_the_sdk_retries_only_what_a_retry_can_fix(
    client: TestClient, tenant: Tenant, client_with: Any
) -> None:
    sdk = sdk_for(client, tenant.secret, max_retries=2)
    sent = RequestCounter(client)
    with pytest.raises(openai.NotFoundError):
        sdk.fine_tuning.jobs.retrieve("ftjob-nope")
    assert sent.count(f"{JOBS}/ftjob-nope") == 1
    with pytest.raises(openai.BadRequestError):
        sdk.fine_tuning.jobs.list(limit=0)
    assert sent.count(JOBS) == 1

    over_quota = client_with(max_stored_bytes_per_key=10)
    sent = RequestCounter(over_quota)
    with pytest.raises(openai.RateLimitError):
        sdk_for(over_quota, tenant.secret, max_retries=2).files.create(
            file=("t.txt", b"hello world\n" * 10), purpose="fine-tune"
        )
    assert sent.count("/v1/files") == 1  # a quota: x-should-retry false, raised at once

    throttled = client_with(rate_limit="2/second")
    sent = RequestCounter(throttled)
    limited_sdk = sdk_for(throttled, tenant.secret, max_retries=2)
    for _ in range(3):  # the third is answered 429 (Retry-After: 1), then retried after it and served
        assert limited_sdk.files.list().data is not None
    assert sent.count("/v1/files") == 4
