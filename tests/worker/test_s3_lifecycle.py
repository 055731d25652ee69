"""A job's whole life on the s3 blob backend, as a deployment runs it: a real worker and API server
(subprocesses given FROMSCRATCH_BLOB_BACKEND=s3 and the AWS_* credentials) against a real
SeaweedFS. The upload, checkpoints, exports and results file are objects in the bucket, the model
downloads through a presigned URL (and through `fromscratch models download`, which follows it),
and deleting the model (with its final checkpoint) and the file removes their objects."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from client.http import Client
from core.models import Blob, Checkpoint, Export, File
from core.settings import Settings
from tests.fixtures.seaweedfs import SeaweedS3, on_s3
from tests.fixtures.service import LiveServer, ServiceProcess, make_job, wait_for_status
from tests.worker.test_final_exports import owner_of

RUN = dict(max_steps=6, batch_size=4, checkpoint_every=3, eval_every=0, warmup_steps=1)


@pytest.fixture
def settings(settings: Settings, s3_env: SeaweedS3, s3_prefix: str) -> Settings:
    """This test's settings (and so its worker's and API server's) on the s3 backend."""
    return on_s3(settings, s3_env, s3_prefix, s3_presigned_downloads=True)


def _keys_of(session_factory: Any, job_id: str, model_id: str) -> dict[str, list[str]]:
    """The object keys of the job's blobs, by what they hold (every blob must be on s3)."""
    with session_factory() as s:
        owned = {
            "checkpoints": select(Checkpoint.blob_id).where(Checkpoint.job_id == job_id),
            "exports": select(Export.blob_id).where(Export.model_id == model_id),
        }
        found: dict[str, list[str]] = {}
        for what, blob_ids in owned.items():
            blobs = s.scalars(select(Blob).where(Blob.id.in_(blob_ids))).all()
            assert blobs and {b.backend for b in blobs} == {"s3"}, what
            found[what] = sorted(str(b.path) for b in blobs)
        return found


def test_a_job_on_the_s3_backend(
    settings: Settings,
    session_factory: Any,
    worker_proc: ServiceProcess,
    live_server: LiveServer,
    s3_env: SeaweedS3,
    s3_prefix: str,
) -> None:
    owner = owner_of(session_factory, live_server.api_key)
    job_id = make_job(settings, session_factory, owner_id=owner, train=RUN)
    job = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    model_id = job.fine_tuned_model
    keys = _keys_of(session_factory, job_id, model_id)
    assert len(keys["checkpoints"]) >= 2 and len(keys["exports"]) == 2  # gguf and hf, made at the end
    with session_factory() as s:
        upload = s.scalar(
            select(Blob).join(File, File.blob_id == Blob.id).where(File.id == job.training_file)
        )
        assert upload is not None and upload.backend == "s3"
    stored = s3_env.keys(s3_prefix)
    assert set(keys["checkpoints"] + keys["exports"] + [str(upload.path)]) <= set(stored)

    url = f"{live_server.url}/v1/models/{model_id}/content"
    r = httpx.get(url, params={"format": "gguf"}, headers=live_server.headers(), timeout=60)
    assert r.status_code == 307, r.text
    gguf = httpx.get(r.headers["location"], timeout=60)
    assert gguf.status_code == 200 and gguf.content[:4] == b"GGUF"
    tar = io.BytesIO()
    with Client(live_server.url, live_server.api_key) as client:  # follows the redirect
        client.download_model(model_id, "checkpoint", tar.write)
    with tarfile.open(fileobj=io.BytesIO(tar.getvalue())) as tf:
        assert any(name.endswith("model.safetensors") for name in tf.getnames())

    # deleting the model removes its exports' objects and its final checkpoint's (the same weights);
    # the job's other checkpoints stay, models of their own
    with session_factory() as s:
        final = s.scalar(
            select(Blob.path)
            .join(Checkpoint, Checkpoint.blob_id == Blob.id)
            .where(Checkpoint.job_id == job_id, Checkpoint.is_final.is_(True))
        )
    assert final is not None
    assert httpx.delete(f"{live_server.url}/v1/models/{model_id}", headers=live_server.headers()).is_success
    left = set(s3_env.keys(s3_prefix))
    assert not left & set(keys["exports"]) and final not in left
    assert set(keys["checkpoints"]) - {final} <= left and len(keys["checkpoints"]) > 1
    # deleting the training file (a finished job keeps its row) removes the uploaded object
    r = httpx.delete(f"{live_server.url}/v1/files/{job.training_file}", headers=live_server.headers())
    assert r.is_success, r.text
    assert str(upload.path) not in s3_env.keys(s3_prefix)
