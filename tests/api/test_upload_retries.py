"""An upload is stored once (issue 25 finding 9): a retry with the same Idempotency-Key gets the
first file back (sequential or at the same time), other bytes under that key are a 400, and an
upload whose client closed the connection after sending its body keeps nothing (a real server
and a raw socket)."""

from __future__ import annotations

import hashlib
import socket
import threading
from typing import Any
from urllib.parse import urlparse

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from core.models import Blob, File
from tests.api.conftest import Tenant, blob_count, count
from tests.api.test_errors import assert_envelope
from tests.fixtures.service import LiveServer, wait_until

TEXT = b"To be, or not to be, that is the question.\n" * 200


def post(client: TestClient, tenant: Tenant, content: bytes, key: str | None) -> Any:
    headers = {**tenant.headers, **({"Idempotency-Key": key} if key else {})}
    files = {"file": ("data.txt", content, "text/plain")}
    return client.post("/v1/files", headers=headers, data={"purpose": "fine-tune"}, files=files)


def test_a_retried_upload_gets_the_first_file_and_stores_nothing_more(
    client: TestClient, tenant: Tenant, session_factory: Any
) -> None:
    first = post(client, tenant, TEXT, "upload-1")
    assert first.status_code == 200, first.text
    blobs = blob_count(session_factory)
    again = post(client, tenant, TEXT, "upload-1")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert blob_count(session_factory) == blobs
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == 1
    err = assert_envelope(post(client, tenant, TEXT + b"more", "upload-1"), 400)
    assert err["code"] == "idempotency_key_reused" and err["param"] == "Idempotency-Key"
    assert post(client, tenant, TEXT, None).json()["id"] != first.json()["id"]  # no key: a new file


def test_concurrent_uploads_under_one_key_store_one_file(
    client: TestClient, tenant: Tenant, session_factory: Any
) -> None:
    content = TEXT + tenant.owner_id.encode()  # bytes of this test alone: their blobs are counted
    answers: list[Any] = []

    def upload() -> None:
        answers.append(post(client, tenant, content, "same"))

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == 1
    digest = answers[0].json().get("sha256") or hashlib.sha256(content).hexdigest()
    # the losers' blobs were removed at once, not left for the gc
    assert count(session_factory, Blob, Blob.sha256 == digest) == 1


def test_an_upload_whose_client_left_after_its_body_is_not_kept(
    live_server: LiveServer, session_factory: Any
) -> None:
    boundary = "fsboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="gone.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        + TEXT * 20
        + f"\r\n--{boundary}--\r\n".encode()
    )
    url = urlparse(live_server.url)
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {live_server.api_key}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(head + body)  # the whole body, then gone before the answer
    wait_until(
        lambda: "not kept: its client closed the connection" in live_server.process.output(),
        timeout=60,
        message=lambda: live_server.process.output(),
    )
    with session_factory() as s:
        assert s.scalar(select(func.count()).select_from(File).where(File.filename == "gone.txt")) == 0
    uploads = live_server.settings.work_path / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())
