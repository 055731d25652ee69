"""/v1/files: streamed upload with validation (nothing stored on a 400), list/get/content/delete."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

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


def test_list_pagination_newest_first(client: TestClient, tenant: Tenant) -> None:
    ids = [upload(client, tenant, f"text {i}\n".encode(), f"{i}.txt").json()["id"] for i in range(3)]
    page = client.get("/v1/files?limit=2", headers=tenant.headers).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [f["id"] for f in page["data"]] == ids[::-1][:2]
    rest = client.get(f"/v1/files?limit=2&after={page['data'][-1]['id']}", headers=tenant.headers).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and rest["has_more"] is False
    asc = client.get("/v1/files?order=asc", headers=tenant.headers).json()
    assert [f["id"] for f in asc["data"]] == ids


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
