"""Model downloads on the s3 blob backend (a real SeaweedFS): streamed through the API by default,
or, with `s3_presigned_downloads`, a 307 to a presigned URL that needs no credentials and names
the file; blobs of the other backends stream whatever the setting."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.main import create_app
from api.routes.files import content_disposition
from core.exports import safe_name
from core.models import Blob, Checkpoint
from core.settings import Settings
from tests.api.conftest import Factory, Tenant
from tests.fixtures.seaweedfs import SeaweedS3, on_s3

CHECKPOINT = os.urandom(3 * (1 << 20) + 77)  # several store chunks


@pytest.fixture
def settings(settings: Settings, s3_env: SeaweedS3, s3_prefix: str) -> Settings:
    """The API tests' settings, on the s3 backend (this test's own prefix in the session's bucket)."""
    return on_s3(settings, s3_env, s3_prefix)


def _content(client: Any, tenant: Tenant, model_id: str) -> httpx.Response:
    return client.get(
        f"/v1/models/{model_id}/content",
        params={"format": "checkpoint"},
        headers=tenant.headers,
        follow_redirects=False,
    )


def _blob_of(session_factory: sessionmaker[Session], job_id: str) -> Blob:
    with session_factory() as s:
        ckpt = s.query(Checkpoint).filter(Checkpoint.job_id == job_id).one()
        blob = s.get(Blob, ckpt.blob_id)
        assert blob is not None
        s.expunge(blob)
        return blob


def test_downloads_stream_through_the_api_by_default(
    client: TestClient,
    factory: Factory,
    tenant: Tenant,
    session_factory: sessionmaker[Session],
    s3_env: SeaweedS3,
    s3_prefix: str,
) -> None:
    job_id, model_id = factory.finished_model(tenant.owner_id, tar_bytes=CHECKPOINT)
    blob = _blob_of(session_factory, job_id)
    assert blob.backend == "s3" and blob.path in s3_env.keys(s3_prefix)
    r = _content(client, tenant, model_id)
    assert r.status_code == 200, r.text
    assert r.content == CHECKPOINT and r.headers["content-length"] == str(len(CHECKPOINT))
    assert r.headers["content-disposition"] == content_disposition(f"{safe_name(model_id)}.tar")


def test_presigned_downloads_redirect_to_s3(
    settings: Settings,
    factory: Factory,
    tenant: Tenant,
    other: Tenant,
    session_factory: sessionmaker[Session],
    s3_env: SeaweedS3,
    s3_prefix: str,
) -> None:
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=CHECKPOINT)
    in_db = Factory(settings.model_copy(update={"blob_backend": "db"}), session_factory)
    _, db_model = in_db.finished_model(tenant.owner_id, tar_bytes=CHECKPOINT[:1000])
    # clients reach the server by another name than the API does: the URL is signed for theirs
    public = s3_env.endpoint_url.replace("127.0.0.1", "localhost")
    presigning = settings.model_copy(
        update={"s3_presigned_downloads": True, "s3_public_endpoint_url": public}
    )
    with TestClient(create_app(presigning)) as c:
        r = _content(c, tenant, model_id)
        assert r.status_code == 307, r.text
        location = r.headers["location"]
        assert location.startswith(f"{public}/{s3_env.bucket}/{s3_prefix}blob-")
        assert "X-Amz-Signature=" in location and "X-Amz-Expires=900" in location

        got = httpx.get(location, timeout=60)  # no credentials: the signature is the permission
        assert got.status_code == 200 and got.content == CHECKPOINT
        assert got.headers["content-disposition"] == content_disposition(f"{safe_name(model_id)}.tar")
        assert got.headers["content-type"] == "application/x-tar"
        parts = urlsplit(location)
        assert httpx.get(f"{parts.scheme}://{parts.netloc}{parts.path}", timeout=60).status_code == 403

        # a blob stored before the switch to s3 streams as before; others' models stay 404
        streamed = _content(c, tenant, db_model)
        assert streamed.status_code == 200 and streamed.content == CHECKPOINT[:1000]
        assert _content(c, other, model_id).status_code == 404
