"""The API while its S3 server is down (this test's own SeaweedFS, killed by PID): an upload and a
download answer 503 `storage_unavailable` with Retry-After, before any byte of a download is sent,
and keep nothing; once the server is back the same requests succeed."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.models import File
from core.settings import Settings
from tests.api.conftest import Factory, Tenant, count, upload
from tests.api.test_errors import assert_envelope
from tests.fixtures.seaweedfs import SeaweedS3, on_s3

CHECKPOINT = b"\x01" * 300_000


@pytest.fixture
def settings(settings: Settings, own_s3: SeaweedS3) -> Settings:
    return on_s3(settings, own_s3, "api-outage/")


def _unavailable(response: Any) -> None:
    err = assert_envelope(response, 503)
    assert err["code"] == "storage_unavailable", err
    assert int(response.headers["retry-after"]) > 0


def test_uploads_and_downloads_answer_503_while_s3_is_down(
    client: TestClient, tenant: Tenant, factory: Factory, session_factory: Any, own_s3: SeaweedS3
) -> None:
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=CHECKPOINT)
    url = f"/v1/models/{model_id}/content?format=checkpoint"
    files_before = count(session_factory, File, File.owner_id == tenant.owner_id)
    own_s3.stop()
    try:
        _unavailable(upload(client, tenant, b"to be or not to be\n" * 50))
        assert count(session_factory, File, File.owner_id == tenant.owner_id) == files_before
        _unavailable(client.get(url, headers=tenant.headers))  # not a 200 cut short
    finally:
        own_s3.start()
    assert upload(client, tenant, b"to be or not to be\n" * 50).status_code == 200
    r = client.get(url, headers=tenant.headers)
    assert r.status_code == 200 and r.content == CHECKPOINT
