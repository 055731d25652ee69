"""Model downloads made by workers, never by the API: an export not stored yet answers 202 with
Retry-After while a real inference worker (`fromscratch worker --queues inference`) makes it, then
200 with the file; failures answer once and are tried again on the next request; the storage quota;
a stale `preparing` row is sent again; a broker that is down leaves nothing behind.

Models here are written straight into the database (tests.api.conftest.Factory) from a real
(untrained) checkpoint; the app runs in a TestClient beside the worker process."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.main import create_app
from core.archives import extract_all
from core.models import Blob, Export, utcnow
from core.settings import Settings
from tests.api.conftest import Factory, Tenant, blob_count, count
from tests.api.test_errors import assert_envelope
from tests.api.test_models import checkpoint_tar, tiny_checkpoint_tar  # noqa: F401 - the fixture
from tests.fixtures.service import ServiceProcess, env_from_settings, fromscratch_cmd
from tests.trainer.test_cli_exports import onnx_logits_match_checkpoint

WAIT = 180.0  # seconds a worker gets to make a tiny model's export (two shared cores)


def content(client: TestClient, tenant: Tenant, model_id: str, fmt: str, dtype: str = "f32") -> Any:
    return client.get(
        f"/v1/models/{model_id}/content", params={"format": fmt, "dtype": dtype}, headers=tenant.headers
    )


def assert_preparing(r: Any, model_id: str, fmt: str, dtype: str = "f32") -> dict[str, Any]:
    assert r.status_code == 202, r.text
    assert r.headers["retry-after"] == "2"
    body = r.json()
    assert body["object"] == "model.export" and body["status"] == "preparing", body
    assert (body["model"], body["format"], body["dtype"]) == (model_id, fmt, dtype), body
    assert body["id"].startswith("export") and body["message"]
    return body


def poll(request: Callable[[], Any], worker: ServiceProcess | None = None) -> Any:
    """Ask again, after each 202's Retry-After, until another answer comes."""
    deadline = time.monotonic() + WAIT
    r = request()
    while r.status_code == 202:
        logs = worker.output() if worker is not None else ""
        assert time.monotonic() < deadline, f"still preparing after {WAIT:.0f} s\n{logs}"
        time.sleep(float(r.headers["retry-after"]))
        r = request()
    return r


def start_inference_worker(settings: Settings, tmp_path: Path, **changes: Any) -> ServiceProcess:
    settings = type(settings)(**{**settings.model_dump(), **changes})
    return ServiceProcess(
        cmd=fromscratch_cmd("worker", "--queues", "inference", "--loglevel", "info"),
        env=env_from_settings(settings),
        log_path=tmp_path / "inference-worker.log",
    ).start()


@pytest.fixture
def client_with(settings: Settings) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**changes: Any) -> TestClient:
        client = TestClient(create_app(type(settings)(**{**settings.model_dump(), **changes})))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def export_rows(session_factory: Any, model_id: str) -> list[Export]:
    with session_factory() as s:
        rows = list(s.scalars(select(Export).where(Export.model_id == model_id).order_by(Export.format)))
        s.expunge_all()
        return rows


def test_exports_are_made_by_a_worker_then_served(
    client: TestClient,
    tenant: Tenant,
    factory: Factory,
    tiny_checkpoint_tar: bytes,  # noqa: F811
    session_factory: Any,
    inference_worker: ServiceProcess,
    tmp_path: Path,
) -> None:
    from gguf import GGUFReader

    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    first = assert_preparing(content(client, tenant, model_id, "gguf"), model_id, "gguf")
    [row] = export_rows(session_factory, model_id)
    assert (row.id, row.format, row.status, row.owner_id) == (
        first["id"],
        "gguf",
        "preparing",
        tenant.owner_id,
    )
    assert row.filename.endswith(".gguf") and row.blob_id is None

    gguf = poll(lambda: content(client, tenant, model_id, "gguf"), inference_worker)
    assert gguf.status_code == 200, gguf.text
    assert gguf.content[:4] == b"GGUF" and gguf.headers["content-length"] == str(len(gguf.content))
    assert row.filename in gguf.headers["content-disposition"]
    (tmp_path / "m.gguf").write_bytes(gguf.content)
    reader = GGUFReader(tmp_path / "m.gguf")
    assert any(t.name == "token_embd.weight" for t in reader.tensors)
    name = reader.fields["general.name"]
    assert bytes(name.parts[name.data[0]]).decode() == model_id  # named as its user knows it
    [row] = export_rows(session_factory, model_id)
    assert row.status == "ready" and row.blob_id is not None and row.error is None
    blobs = blob_count(session_factory)
    again = content(client, tenant, model_id, "gguf")  # stored: at once, the same bytes, nothing new
    assert again.status_code == 200 and again.content == gguf.content
    assert blob_count(session_factory) == blobs

    # ONNX gives the checkpoint's own logits
    assert_preparing(content(client, tenant, model_id, "onnx"), model_id, "onnx")
    onnx = poll(lambda: content(client, tenant, model_id, "onnx"), inference_worker)
    assert onnx.status_code == 200, onnx.text
    (tmp_path / "m.onnx").write_bytes(onnx.content)
    with tarfile.open(fileobj=io.BytesIO(tiny_checkpoint_tar)) as tf:
        extract_all(tf, tmp_path / "ckpt")
    onnx_logits_match_checkpoint(tmp_path / "m.onnx", tmp_path / "ckpt" / "step-00000050")

    # a dtype is an export of its own: hf f16, one tar of the folder
    assert_preparing(content(client, tenant, model_id, "hf", "f16"), model_id, "hf", "f16")
    hf = poll(lambda: content(client, tenant, model_id, "hf", "f16"), inference_worker)
    assert hf.status_code == 200, hf.text
    assert hf.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(hf.content)) as tf:
        names = tf.getnames()
        config = tf.extractfile(next(n for n in names if n.endswith("/config.json")))
        assert config is not None and json.load(config)["torch_dtype"] == "float16"
    assert {n.split("/")[0] for n in names} == {model_id.replace(":", "-") + "-hf-f16"}
    assert any(n.endswith("model.safetensors") for n in names)
    assert [r.format for r in export_rows(session_factory, model_id)] == ["gguf", "hf-f16", "onnx"]

    # deleting the model deletes its exports (any status) and their files
    stored = [r.blob_id for r in export_rows(session_factory, model_id)]
    pending = content(client, tenant, model_id, "gguf", "q8_0")  # one still preparing, too
    assert pending.status_code in (200, 202)
    assert client.delete(f"/v1/models/{model_id}", headers=tenant.headers).status_code == 200
    assert count(session_factory, Export, Export.model_id == model_id) == 0
    assert count(session_factory, Blob, Blob.id.in_(stored)) == 0


def test_concurrent_first_requests_share_one_export(
    client: TestClient,
    tenant: Tenant,
    factory: Factory,
    tiny_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    """No worker runs: every request answers 202 for the one row the first insert made."""
    from concurrent.futures import ThreadPoolExecutor

    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    app = client.app
    clients = [TestClient(app) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda c: content(c, tenant, model_id, "onnx"), clients))
    ids = {assert_preparing(r, model_id, "onnx")["id"] for r in answers}
    assert len(ids) == 1
    assert count(client.app.state.session_factory, Export, Export.model_id == model_id) == 1


@pytest.fixture(scope="module")
def partial_rope_tar(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A model the Hugging Face export cannot express (rope_dims 4 of head dim 8): its export fails
    in the worker."""
    return checkpoint_tar(tmp_path_factory.mktemp("partial"), rope_dims=4)


def test_a_failed_export_answers_once_then_is_tried_again(
    client: TestClient,
    tenant: Tenant,
    factory: Factory,
    partial_rope_tar: bytes,
    session_factory: Any,
    inference_worker: ServiceProcess,
) -> None:
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=partial_rope_tar)
    first = assert_preparing(content(client, tenant, model_id, "hf"), model_id, "hf")
    failed = poll(lambda: content(client, tenant, model_id, "hf"), inference_worker)
    err = assert_envelope(failed, 400)
    assert err["code"] == "export_failed" and err["param"] == "format", err
    assert "partial rotary embeddings" in err["message"] and model_id in err["message"], err
    assert count(session_factory, Export, Export.model_id == model_id) == 0  # answered once, then gone
    # the next request sends it to a worker again (a new row)
    retried = assert_preparing(content(client, tenant, model_id, "hf"), model_id, "hf")
    assert retried["id"] != first["id"]
    assert assert_envelope(poll(lambda: content(client, tenant, model_id, "hf")), 400)


def test_a_stale_preparing_export_is_sent_again(
    client: TestClient,
    tenant: Tenant,
    factory: Factory,
    tiny_checkpoint_tar: bytes,  # noqa: F811
    session_factory: Any,
    settings: Settings,
    tmp_path: Path,
) -> None:
    """A row whose worker died (no message anywhere) and older than export_stale_seconds: the next
    request touches it and sends it again, and a worker makes it."""
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    old = utcnow() - timedelta(seconds=settings.export_stale_seconds + 60)
    with session_factory() as s:
        row = Export(
            model_id=model_id,
            format="gguf",
            owner_id=tenant.owner_id,
            status="preparing",
            filename="x.gguf",
        )
        s.add(row)
        s.flush()
        s.execute(update(Export).where(Export.id == row.id).values(updated_at=old, created_at=old))
        s.commit()
        export_id = row.id
    assert assert_preparing(content(client, tenant, model_id, "gguf"), model_id, "gguf")["id"] == export_id
    [touched] = export_rows(session_factory, model_id)
    assert touched.updated_at > old + timedelta(seconds=30)
    worker = start_inference_worker(settings, tmp_path)
    try:
        r = poll(lambda: content(client, tenant, model_id, "gguf"), worker)
    finally:
        worker.stop()
    assert r.status_code == 200 and r.content[:4] == b"GGUF", r.text


def test_an_export_that_would_pass_the_storage_quota(
    client_with: Callable[..., TestClient],
    tenant: Tenant,
    factory: Factory,
    tiny_checkpoint_tar: bytes,  # noqa: F811
    session_factory: Any,
    settings: Settings,
    tmp_path: Path,
) -> None:
    """Room for a few bytes: the API sends it; the worker finds the file too big, deletes it and
    fails the row; the API answers 429 once and keeps nothing. Full: 429 before anything is sent."""
    from core.quotas import stored_bytes

    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    with session_factory() as s:
        used = stored_bytes(s, tenant.owner_id)
    limit = used + 1000
    c = client_with(max_stored_bytes_per_key=limit)
    blobs = blob_count(session_factory)
    worker = start_inference_worker(settings, tmp_path, max_stored_bytes_per_key=limit)
    try:
        assert_preparing(content(c, tenant, model_id, "gguf"), model_id, "gguf")
        r = poll(lambda: content(c, tenant, model_id, "gguf"), worker)
    finally:
        worker.stop()
    err = assert_envelope(r, 429)
    assert err["code"] == "quota_exceeded" and err["param"] == "format", err
    assert "max_stored_bytes_per_key" in err["message"] and f"use {used} bytes" in err["message"], err
    assert int(r.headers["retry-after"]) >= 1
    assert count(session_factory, Export, Export.model_id == model_id) == 0
    assert blob_count(session_factory) == blobs

    full = client_with(max_stored_bytes_per_key=used)
    err = assert_envelope(content(full, tenant, model_id, "onnx"), 429)
    assert err["code"] == "quota_exceeded"
    assert count(session_factory, Export, Export.model_id == model_id) == 0


def test_broker_down_keeps_nothing(
    settings: Settings,
    tenant: Tenant,
    factory: Factory,
    tiny_checkpoint_tar: bytes,  # noqa: F811
    session_factory: Any,
) -> None:
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    bad = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(bad)) as c:
        err = assert_envelope(content(c, tenant, model_id, "gguf"), 503)
        assert err["code"] == "broker_unavailable", err
        assert (
            c.get(
                f"/v1/models/{model_id}/content", params={"format": "checkpoint"}, headers=tenant.headers
            ).content
            == tiny_checkpoint_tar
        )
    assert count(session_factory, Export, Export.model_id == model_id) == 0


def test_export_formats_is_validated_naming_the_field(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    file_id = factory.file(tenant.owner_id)
    for bad, words in [
        (["gguf", "zip"], "must be one of"),
        (["gguf", "gguf"], "names 'gguf' twice"),
        ("gguf", "must be a list"),
    ]:
        body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": {"export_formats": bad}}
        err = assert_envelope(client.post("/v1/fine_tuning/jobs", headers=tenant.headers, json=body), 400)
        assert err["param"] == "export_formats" and words in err["message"], err
    body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": {"export_formats": []}}
    job = client.post("/v1/fine_tuning/jobs", headers=tenant.headers, json=body)
    assert job.status_code == 200, job.text
    assert job.json()["config"]["train"]["export_formats"] == []


@pytest.fixture
def tiny_model_id(tenant: Tenant, factory: Factory, tiny_checkpoint_tar: bytes) -> str:  # noqa: F811
    return factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)[1]


def test_a_dtype_the_format_is_not_made_in_is_400_before_any_worker(
    client: TestClient,
    tenant: Tenant,
    tiny_model_id: str,
    session_factory: Any,
    tiny_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    model_id = tiny_model_id
    for fmt, dtype, words in [
        ("hf", "q8_0", "supports dtype f32 or f16 or bf16 only"),
        ("onnx", "bf16", "supports dtype f32 only"),
        ("checkpoint", "f16", "the checkpoint is the trained f32 weights"),
    ]:
        r = client.get(
            f"/v1/models/{model_id}/content", params={"format": fmt, "dtype": dtype}, headers=tenant.headers
        )
        err = assert_envelope(r, 400)
        assert (err["param"], err["code"]) == ("dtype", "invalid_value") and words in err["message"], err
    assert count(session_factory, Export, Export.model_id == model_id) == 0  # nothing sent to a worker
    ok = client.get(
        f"/v1/models/{model_id}/content",
        params={"format": "checkpoint", "dtype": "f32"},
        headers=tenant.headers,
    )
    assert ok.content == tiny_checkpoint_tar
