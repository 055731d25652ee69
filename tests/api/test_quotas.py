"""Per-key quotas and the rate limit: each refusal is a 429 with Retry-After and a message naming
the quota, and writes nothing; concurrent creates cannot overshoot the active-jobs quota (on
PostgreSQL through a live server, on the embedded SQLite through the app's threadpool)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.main import create_app
from api.rate_limit import RateLimiter
from core.keys import create_key
from core.models import Event, Export, File, Job
from core.settings import Settings
from tests.api.conftest import SHAKESPEARE, Factory, Tenant, blob_count, count, upload
from tests.api.test_errors import assert_envelope
from tests.fixtures.service import LiveServer

SMALL = SHAKESPEARE.read_bytes()[:20_000]


def with_settings(settings: Settings, **changes: Any) -> Settings:
    return type(settings)(**{**settings.model_dump(), **changes})


@pytest.fixture
def client_with(settings: Settings) -> Iterator[Callable[..., TestClient]]:
    """client_with(**settings changes) -> a TestClient of the app with those settings."""
    clients: list[TestClient] = []

    def make(**changes: Any) -> TestClient:
        client = TestClient(create_app(with_settings(settings, **changes)))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def assert_quota(response: Any, setting: str, code: str = "quota_exceeded") -> dict[str, Any]:
    err = assert_envelope(response, 429)
    assert err["code"] == code, err
    assert setting in err["message"], err
    retry_after = response.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1, response.headers
    return err


def create(client: TestClient, tenant: Tenant, file_id: str, **headers: str) -> Any:
    body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": {"max_steps": 3}}
    return client.post("/v1/fine_tuning/jobs", headers={**tenant.headers, **headers}, json=body)


def jobs_of(session_factory: Any, owner: str) -> int:
    return count(session_factory, Job, Job.owner_id == owner)


# ------------------------------------------------------------------------------- active jobs
def test_active_jobs_quota(
    client_with: Callable[..., TestClient], tenant: Tenant, other: Tenant, session_factory: Any
) -> None:
    c = client_with(max_active_jobs_per_key=2)
    fid = upload(c, tenant, SMALL).json()["id"]
    first = create(c, tenant, fid, **{"Idempotency-Key": "one"})
    assert first.status_code == 200, first.text
    assert create(c, tenant, fid).status_code == 200
    events = count(session_factory, Event)

    err = assert_quota(create(c, tenant, fid), "max_active_jobs_per_key")
    assert "max_active_jobs_per_key=2" in err["message"] and "2 jobs" in err["message"], err
    assert jobs_of(session_factory, tenant.owner_id) == 2 and count(session_factory, Event) == events
    # a retried create (same Idempotency-Key) still answers with its job
    again = create(c, tenant, fid, **{"Idempotency-Key": "one"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    # another key has its own quota
    other_file = upload(c, other, SMALL).json()["id"]
    assert create(c, other, other_file).status_code == 200

    # a paused job does not count, and resuming it is checked like a create
    job_id = first.json()["id"]
    assert c.post(f"/v1/fine_tuning/jobs/{job_id}/pause", headers=tenant.headers).json()["status"] == "paused"
    third = create(c, tenant, fid)
    assert third.status_code == 200, third.text
    assert_quota(
        c.post(f"/v1/fine_tuning/jobs/{job_id}/resume", headers=tenant.headers), "max_active_jobs_per_key"
    )
    assert c.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers).json()["status"] == "paused"
    # a finished (cancelled) job frees its slot
    c.post(f"/v1/fine_tuning/jobs/{third.json()['id']}/cancel", headers=tenant.headers)
    resumed = c.post(f"/v1/fine_tuning/jobs/{job_id}/resume", headers=tenant.headers)
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued", resumed.text


def _parallel_creates(post: Callable[[], int], n: int) -> list[int]:
    with ThreadPoolExecutor(max_workers=n) as pool:
        return sorted(pool.map(lambda _: post(), range(n)))


@pytest.mark.service_settings(max_active_jobs_per_key=5)
def test_parallel_creates_never_overshoot_on_postgres(live_server: LiveServer, session_factory: Any) -> None:
    headers = live_server.headers()
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=60) as c:
        fid = c.post(
            "/v1/files", data={"purpose": "fine-tune"}, files={"file": ("d.txt", SMALL, "text/plain")}
        ).json()["id"]
        body = {"model": "llama-tiny", "training_file": fid, "hyperparameters": {"max_steps": 3}}
        statuses = _parallel_creates(lambda: c.post("/v1/fine_tuning/jobs", json=body).status_code, 20)
    assert statuses == [200] * 5 + [429] * 15, statuses
    with session_factory() as s:
        owner_id = s.scalar(select(File.owner_id).where(File.id == fid))
    assert jobs_of(session_factory, owner_id) == 5


def test_parallel_creates_never_overshoot_on_sqlite(
    sqlite_settings: Settings, sqlite_session_factory: Any
) -> None:
    with sqlite_session_factory() as s:
        key, secret = create_key(s, "sqlite")
        s.commit()
    tenant = Tenant(key.owner_id, secret)
    app = create_app(with_settings(sqlite_settings, max_active_jobs_per_key=5))
    with TestClient(app) as c:
        fid = upload(c, tenant, SMALL).json()["id"]
        statuses = _parallel_creates(lambda: create(c, tenant, fid).status_code, 20)
    assert statuses == [200] * 5 + [429] * 15, statuses
    assert jobs_of(sqlite_session_factory, tenant.owner_id) == 5


# ------------------------------------------------------------------------------- stored bytes
def _leftovers(settings: Settings) -> list[Path]:
    uploads = settings.work_path / "uploads"
    return list(uploads.iterdir()) if uploads.is_dir() else []


def test_upload_over_the_storage_quota(
    client_with: Callable[..., TestClient], tenant: Tenant, session_factory: Any, settings: Settings
) -> None:
    c = client_with(max_stored_bytes_per_key=30_000)
    assert upload(c, tenant, SMALL).status_code == 200  # 20 000 of 30 000 bytes
    files, blobs = count(session_factory, File, File.owner_id == tenant.owner_id), blob_count(session_factory)

    # Content-Length says it will not fit: refused before the body is read
    err = assert_quota(upload(c, tenant, SMALL), "max_stored_bytes_per_key")
    assert err["param"] == "file" and "20000 bytes" in err["message"], err

    # no Content-Length (chunked): cut as soon as the file part passes the room left
    boundary = "quota-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n"
    ).encode()

    def chunked() -> Iterator[bytes]:
        yield head
        for _ in range(40):  # 40 x 1000 bytes, far past the 10 000 left
            yield b"lorem ipsum " * 83 + b"x\n"
        yield f"\r\n--{boundary}--\r\n".encode()

    r = c.post(
        "/v1/files",
        headers={**tenant.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=chunked(),
    )
    assert "content-length" not in r.request.headers
    assert_quota(r, "max_stored_bytes_per_key")

    assert count(session_factory, File, File.owner_id == tenant.owner_id) == files
    assert blob_count(session_factory) == blobs and _leftovers(settings) == []
    # deleting a file frees its bytes
    first = c.get("/v1/files", headers=tenant.headers).json()["data"][0]["id"]
    assert c.delete(f"/v1/files/{first}", headers=tenant.headers).status_code == 200
    assert upload(c, tenant, SMALL).status_code == 200


def test_uploads_past_the_file_count_are_429_and_a_delete_frees_one(
    client_with: Callable[..., TestClient], tenant: Tenant, session_factory: Any, settings: Settings
) -> None:
    c = client_with(max_files_per_key=2)
    first = upload(c, tenant, b"one\n").json()["id"]
    assert upload(c, tenant, b"two\n").status_code == 200
    blobs = blob_count(session_factory)
    err = assert_quota(upload(c, tenant, b"three\n"), "FROMSCRATCH_MAX_FILES_PER_KEY")
    assert err["param"] == "file" and "keeps 2 uploaded files" in err["message"], err
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == 2
    assert blob_count(session_factory) == blobs and _leftovers(settings) == []  # its bytes removed
    assert c.delete(f"/v1/files/{first}", headers=tenant.headers).status_code == 200
    assert upload(c, tenant, b"three\n").status_code == 200


def test_concurrent_uploads_are_checked_again_before_commit(
    client_with: Callable[..., TestClient],
    tenant: Tenant,
    session_factory: Any,
    settings: Settings,
    monkeypatch: Any,
) -> None:
    """The room measured before the body arrives may be gone by its end (a concurrent upload):
    the last check, under the owner's lock, refuses and removes the stored bytes."""
    c = client_with(max_stored_bytes_per_key=30_000)
    assert upload(c, tenant, SMALL).status_code == 200
    blobs = blob_count(session_factory)
    monkeypatch.setattr("api.routes.files._stored_bytes", lambda request, owner_id: 0)
    r = c.post(  # no Content-Length check either: as if both uploads started at once
        "/v1/files",
        headers=tenant.headers,
        data={"purpose": "fine-tune"},
        files={"file": ("d.txt", SMALL, "text/plain")},
    )
    err = assert_quota(r, "max_stored_bytes_per_key")
    assert "20000 bytes" in err["message"], err
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == 1
    assert blob_count(session_factory) == blobs and _leftovers(settings) == []


def test_checkpoints_and_exports_count_toward_storage(
    client_with: Callable[..., TestClient], tenant: Tenant, factory: Factory, session_factory: Any
) -> None:
    c = client_with(max_stored_bytes_per_key=10_000)
    # 12 000 bytes of checkpoints (the file of the job is 2 400): over the quota
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=b"\0" * 6_000, steps=(10, 20))
    assert_quota(upload(c, tenant, b"hello\n" * 10), "max_stored_bytes_per_key")
    err = assert_quota(
        c.get(f"/v1/models/{model_id}/content?format=gguf", headers=tenant.headers),
        "max_stored_bytes_per_key",
    )
    assert err["param"] == "format", err
    assert count(session_factory, Export, Export.model_id == model_id) == 0
    # the checkpoint itself stays downloadable (it is stored already)
    assert (
        c.get(f"/v1/models/{model_id}/content?format=checkpoint", headers=tenant.headers).status_code == 200
    )
    # a new job could store neither checkpoints nor its model: refused before it is queued
    jobs = count(session_factory, Job, Job.owner_id == tenant.owner_id)
    file_id = c.get("/v1/files", headers=tenant.headers).json()["data"][0]["id"]
    err = assert_quota(create(c, tenant, file_id), "max_stored_bytes_per_key")
    assert "a new job's model and checkpoints" in err["message"], err
    assert count(session_factory, Job, Job.owner_id == tenant.owner_id) == jobs


# ------------------------------------------------------------------------------- rate limit
def test_rate_limit_per_key(client_with: Callable[..., TestClient], tenant: Tenant, other: Tenant) -> None:
    c = client_with(rate_limit="3/minute")
    for _ in range(3):
        assert c.get("/v1/files", headers=tenant.headers).status_code == 200
    r = c.get("/v1/files", headers=tenant.headers)
    err = assert_quota(r, "FROMSCRATCH_RATE_LIMIT", code="rate_limit_exceeded")
    assert err["type"] == "requests", err  # as OpenAI types a requests-per-period limit
    assert "3 requests per minute" in err["message"] and "'3/minute'" in err["message"], err
    assert 1 <= int(r.headers["retry-after"]) <= 60
    # the stream is limited too; another key is not; the open endpoints never are
    assert c.get("/v1/fine_tuning/jobs/x/stream", headers=tenant.headers).status_code == 429
    assert c.get("/v1/files", headers=other.headers).status_code == 200
    for _ in range(10):
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200


def test_rate_limit_counts_in_memory_when_embedded(
    sqlite_settings: Settings, sqlite_session_factory: Any
) -> None:
    limiter = RateLimiter.from_settings(sqlite_settings)
    assert limiter.storage_name == "memory"
    with sqlite_session_factory() as s:
        _, secret = create_key(s, "sqlite")
        s.commit()
    app = create_app(with_settings(sqlite_settings, rate_limit="2/minute"))
    with TestClient(app) as c:
        headers = {"Authorization": f"Bearer {secret}"}
        assert [c.get("/v1/files", headers=headers).status_code for _ in range(3)] == [200, 200, 429]


def test_rate_limit_store_down_lets_requests_through(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RateLimiter("1/minute", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    with caplog.at_level(logging.WARNING, logger="fromscratch.api"):
        for _ in range(5):
            limiter.check("key-1")  # never raises: the store is down, the limit is not enforced
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1


def test_rate_limit_in_redis_is_shared_between_processes(settings: Settings) -> None:
    first = RateLimiter.from_settings(with_settings(settings, rate_limit="2/minute"))
    second = RateLimiter.from_settings(with_settings(settings, rate_limit="2/minute"))
    assert first.storage_name == "redis"
    key = f"key-{id(first)}"
    first.check(key)
    second.check(key)
    with pytest.raises(Exception) as refused:
        first.check(key)
    assert getattr(refused.value, "status", None) == 429


def test_bad_rate_limit_is_refused_at_startup(settings: Settings) -> None:
    with pytest.raises(ValueError, match="rate_limit"):
        create_app(with_settings(settings, rate_limit="lots"))
