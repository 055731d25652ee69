"""/v1/files: streamed upload with validation (nothing stored on a 400), list/get/content/delete."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.models import File
from tests.api.conftest import SHAKESPEARE, Tenant, blob_count, count, upload
from tests.api.test_errors import assert_envelope


def test_upload_text_roundtrip(client: TestClient, tenant: Tenant) -> None:
    data = SHAKESPEARE.read_bytes()
    r = upload(client, tenant, data, "shakespeare.txt")
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["object"] == "file" and f["id"].startswith("file-")
    assert f["bytes"] == len(data)
    assert f["sha256"] == hashlib.sha256(data).hexdigest()
    assert f["filename"] == "shakespeare.txt" and f["purpose"] == "fine-tune" and f["format"] == "text"
    assert isinstance(f["created_at"], int)

    got = client.get(f"/v1/files/{f['id']}", headers=tenant.headers).json()
    assert got == f
    content = client.get(f"/v1/files/{f['id']}/content", headers=tenant.headers)
    assert content.status_code == 200
    assert content.content == data
    assert content.headers["content-length"] == str(len(data))
    assert "shakespeare.txt" in content.headers["content-disposition"]


def test_upload_jsonl_detected(client: TestClient, tenant: Tenant) -> None:
    lines = [
        {"text": "hello"},
        {"prompt": "a", "completion": "b"},
        {"messages": [{"role": "user", "content": "hi"}]},
    ]
    body = "\n".join(json.dumps(x) for x in lines).encode()
    r = upload(client, tenant, body, "d.jsonl")
    assert r.status_code == 200, r.text
    assert r.json()["format"] == "jsonl"


def _rejected(
    client: TestClient,
    tenant: Tenant,
    session_factory: Any,
    content: bytes,
    filename: str,
    purpose: str = "fine-tune",
) -> dict[str, Any]:
    blobs = blob_count(session_factory)
    err = assert_envelope(upload(client, tenant, content, filename, purpose), 400)
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == 0
    assert blob_count(session_factory) == blobs
    uploads = Path(client.app.state.settings.work_dir) / "uploads"  # type: ignore[attr-defined]
    assert not uploads.exists() or list(uploads.iterdir()) == []  # the spooled upload is gone too
    return err


def test_broken_jsonl_names_the_line_and_stores_nothing(
    client: TestClient, tenant: Tenant, session_factory: Any
) -> None:
    body = b'{"text": "ok"}\n{"text": "fine"}\n{"text": broken\n'
    err = _rejected(client, tenant, session_factory, body, "bad.jsonl")
    assert err["param"] == "file"
    assert "line 3" in err["message"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b'{"text":"ok \\ud800"}', "line 2: text holds the lone surrogate U+D800"),
        (
            b'{"messages":[{"role":"user","content":"\\ud83d"},{"role":"assistant","content":"x"}]}',
            "line 2: messages[0].content holds the lone surrogate U+D83D",
        ),
        (
            b'{"text":"a","n":' + b"9" * 5000 + b"}",
            "line 2: the record holds an integer of more than 4300 digits",
        ),
    ],
)
def test_json_no_text_can_hold_is_refused_naming_the_line(
    client: TestClient, tenant: Tenant, session_factory: Any, line: bytes, needle: str
) -> None:
    """Half an emoji (a lone surrogate escape) and an integer past Python's digit limit parse into
    what cannot be encoded or converted: each was a 500 that reset the connection."""
    err = _rejected(client, tenant, session_factory, b'{"text": "fine"}\n' + line + b"\n", "bad.jsonl")
    assert (err["param"], err["code"]) == ("file", "invalid_file") and needle in err["message"], err


def test_unknown_record_shape_rejected(client: TestClient, tenant: Tenant, session_factory: Any) -> None:
    err = _rejected(client, tenant, session_factory, b'{"text": "ok"}\n{"foo": 1}\n', "bad.jsonl")
    assert "line 2" in err["message"]


def test_empty_and_binary_rejected(client: TestClient, tenant: Tenant, session_factory: Any) -> None:
    err = _rejected(client, tenant, session_factory, b"", "empty.txt")
    assert "empty" in err["message"]
    err = _rejected(client, tenant, session_factory, b"abc\x00\x01\x02" * 10, "bin.txt")
    assert err["param"] == "file"
    err = _rejected(client, tenant, session_factory, b"caf\xe9 latin-1\n", "latin.txt")
    assert "UTF-8" in err["message"]


def test_oversize_rejected(settings: Any, tenant: Tenant, session_factory: Any) -> None:
    from api.main import create_app

    small = settings.model_copy(update={"max_upload_bytes": 1000})
    with TestClient(create_app(small)) as c:
        err = _rejected(c, tenant, session_factory, b"a" * 5000, "big.txt")
        assert err["param"] == "file" and err["code"] == "file_too_large"
        # over the limit but within the multipart slack: caught after parsing
        err = _rejected(c, tenant, session_factory, b"a" * 1001, "big.txt")
        assert err["code"] == "file_too_large"
        assert upload(c, tenant, b"a" * 1000, "ok.txt").status_code == 200


def test_purpose_and_missing_parts(client: TestClient, tenant: Tenant, session_factory: Any) -> None:
    err = _rejected(client, tenant, session_factory, b"hello\n", "a.txt", purpose="assistants")
    assert err["param"] == "purpose"
    r = client.post(
        "/v1/files", headers=tenant.headers, data={"purpose": "fine-tune"}, files={"other": ("x", b"y")}
    )
    assert assert_envelope(r, 400)["param"] == "file"
    r = client.post("/v1/files", headers=tenant.headers, files={"file": ("a.txt", b"hello\n")})
    assert assert_envelope(r, 400)["param"] == "purpose"
    r = client.post("/v1/files", headers=tenant.headers, json={"file": "x"})
    assert assert_envelope(r, 400)["param"] == "file"
    # a field it would not honour (OpenAI's expiry) is refused, not ignored; nothing is kept
    files_before = count(session_factory, File, File.owner_id == tenant.owner_id)
    r = client.post(
        "/v1/files",
        headers=tenant.headers,
        data={"purpose": "fine-tune", "expires_after[seconds]": "3600"},
        files={"file": ("a.txt", b"hello\n")},
    )
    err = assert_envelope(r, 400)
    assert (err["param"], err["code"]) == ("expires_after[seconds]", "unknown_parameter"), err
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == files_before


def test_list_pagination_newest_first(client: TestClient, tenant: Tenant) -> None:
    ids = [upload(client, tenant, f"text {i}\n".encode(), f"{i}.txt").json()["id"] for i in range(3)]
    page = client.get("/v1/files?limit=2", headers=tenant.headers).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [f["id"] for f in page["data"]] == ids[::-1][:2]
    rest = client.get(f"/v1/files?limit=2&after={page['data'][-1]['id']}", headers=tenant.headers).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and rest["has_more"] is False
    asc = client.get("/v1/files?order=asc", headers=tenant.headers).json()
    assert [f["id"] for f in asc["data"]] == ids
    uploads = client.get("/v1/files?purpose=fine-tune", headers=tenant.headers).json()
    assert {f["id"] for f in uploads["data"]} >= set(ids)
    err = assert_envelope(client.get("/v1/files?purpose=bogus", headers=tenant.headers), 400)
    assert err["param"] == "purpose"  # a purpose no file can have, as an upload would be told


def test_delete_unused_file(client: TestClient, tenant: Tenant, session_factory: Any) -> None:
    blobs = blob_count(session_factory)
    fid = upload(client, tenant, b"some text\n", "a.txt").json()["id"]
    assert blob_count(session_factory) == blobs + 1
    r = client.delete(f"/v1/files/{fid}", headers=tenant.headers)
    assert r.json() == {"id": fid, "object": "file", "deleted": True}
    assert_envelope(client.get(f"/v1/files/{fid}", headers=tenant.headers), 404)
    assert blob_count(session_factory) == blobs


def test_delete_refused_while_a_live_job_uses_it(
    client: TestClient, tenant: Tenant, factory: Any, session_factory: Any
) -> None:
    blobs = blob_count(session_factory)
    fid = upload(client, tenant, b"some text\n" * 100, "a.txt").json()["id"]
    job_id = factory.job(tenant.owner_id, status="running", file_id=fid)
    err = assert_envelope(client.delete(f"/v1/files/{fid}", headers=tenant.headers), 400)
    assert job_id in err["message"]
    factory.set_status(job_id, "cancelled")
    assert client.delete(f"/v1/files/{fid}", headers=tenant.headers).status_code == 200
    assert_envelope(client.get(f"/v1/files/{fid}", headers=tenant.headers), 404)
    assert fid not in [f["id"] for f in client.get("/v1/files", headers=tenant.headers).json()["data"]]
    # the finished job still names its training file
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers).json()["training_file"] == fid
    # its row stays, marked deleted, and its bytes are freed
    assert blob_count(session_factory) == blobs
    with session_factory() as session:
        row = session.get(File, fid)
        assert row is not None and row.deleted_at is not None and row.blob_id is None


# ------------------------------------------------------------------------------------------------
# Uploads that end badly, driven through the ASGI interface so the body can stop midway.
BOUNDARY = "fromscratchtestboundary"


def _part_head(filename: str = "big.txt") -> bytes:
    return (
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
        f"--{BOUNDARY}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


def _asgi_upload(
    app: Any, tenant: Tenant, chunks: list[bytes], disconnect: bool
) -> tuple[int, dict[str, Any], int]:
    """POST /v1/files with `chunks` as the body and no Content-Length; the client goes away after
    the last chunk when `disconnect`. Returns (status, error object, body messages the app read)."""
    import anyio

    messages: list[dict[str, Any]] = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    if not disconnect:
        messages.append({"type": "http.request", "body": b"", "more_body": False})
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(messages):
            read += 1
            return messages[read - 1]
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/files",
        "raw_path": b"/v1/files",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {tenant.secret}".encode()),
            (b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    anyio.run(app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(start["status"]), json.loads(body)["error"], read


def _nothing_left(app: Any, tenant: Tenant, session_factory: Any, blobs_before: int) -> None:
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == 0
    assert blob_count(session_factory) == blobs_before
    uploads = Path(app.state.settings.work_dir) / "uploads"
    assert not uploads.exists() or list(uploads.iterdir()) == []


def test_aborted_upload_leaves_nothing(app: Any, tenant: Tenant, session_factory: Any) -> None:
    blobs = blob_count(session_factory)
    status, err, _ = _asgi_upload(app, tenant, [_part_head(), b"line of text\n" * 5000], disconnect=True)
    assert (status, err["code"]) == (400, "upload_aborted")
    _nothing_left(app, tenant, session_factory, blobs)


def test_streamed_oversize_is_cut_at_the_limit(settings: Any, tenant: Tenant, session_factory: Any) -> None:
    from api.main import create_app

    app = create_app(settings.model_copy(update={"max_upload_bytes": 1000}))
    blobs = blob_count(session_factory)
    chunks = [_part_head(), *([b"a" * 16384] * 64)]  # 1 MiB, no Content-Length to refuse it early
    status, err, read = _asgi_upload(app, tenant, chunks, disconnect=False)
    assert (status, err["code"], err["param"]) == (400, "file_too_large", "file")
    assert "1000 bytes" in err["message"]
    assert read < len(chunks) // 2  # it stopped reading soon after the limit
    _nothing_left(app, tenant, session_factory, blobs)


def test_truncated_multipart_body_is_rejected(
    client: TestClient, tenant: Tenant, session_factory: Any
) -> None:
    blobs = blob_count(session_factory)
    r = client.post(
        "/v1/files",
        headers={**tenant.headers, "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
        content=_part_head() + b"text without the closing boundary\n",
    )
    err = assert_envelope(r, 400)
    assert err["param"] == "file" and err["code"] == "invalid_multipart"
    _nothing_left(client.app, tenant, session_factory, blobs)
