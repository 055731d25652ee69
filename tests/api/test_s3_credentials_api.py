"""S3 refusing the API server's credentials: 503 `storage_misconfigured` (the operator's to fix, no
retry), not a 500. A real SeaweedFS checks them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from core.settings import Settings
from tests.api.conftest import Tenant, upload
from tests.fixtures.seaweedfs import SeaweedS3, on_s3


def test_the_api_answers_503_storage_misconfigured(
    settings: Settings, s3_env: SeaweedS3, s3_prefix: str, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with TestClient(create_app(on_s3(settings, s3_env, s3_prefix))) as client:
        r = upload(client, tenant, b"some words to train on\n" * 20, "data.txt")
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "storage_misconfigured" and r.headers["x-should-retry"] == "false"
