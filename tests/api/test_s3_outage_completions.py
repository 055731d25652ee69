"""Completions while the blob store's S3 server is down (this test's own SeaweedFS, killed by PID):
the inference worker (a real `fromscratch worker --queues inference`) cannot read the model's
weights, and the API answers as an upload or a download does in an outage (api/store_errors.py):
503 `storage_unavailable` with Retry-After, not a 500 `inference_failed`, for /v1/completions,
/v1/chat/completions and /generate. A streamed completion has sent its headers before the worker
loads the model: its last event is that error, with no [DONE]. Once the server is back, the same
request is answered, and no request row is left behind."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.models import InferenceRequest
from core.settings import Settings
from tests.api.conftest import Factory, Tenant, count
from tests.api.test_completions_api import CHAT, COMPLETIONS, chat_body
from tests.api.test_errors import assert_envelope
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - a fixture, used below
from tests.fixtures.seaweedfs import SeaweedS3, on_s3
from tests.fixtures.service import ServiceProcess, wait_until


@pytest.fixture
def settings(settings: Settings, own_s3: SeaweedS3) -> Settings:
    return on_s3(settings, own_s3, "completions-outage/")


@pytest.fixture
def model_id(factory: Factory, tenant: Tenant, tiny_checkpoint_tar: bytes) -> str:  # noqa: F811
    return factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)[1]


def _ready(worker: ServiceProcess) -> None:
    """The inference worker consumes its queue (a completion would otherwise wait for it to start)."""
    wait_until(lambda: " ready." in worker.output(), timeout=180, message=lambda: f"ready\n{worker.output()}")


def _unavailable(response: Any, worker: ServiceProcess) -> None:
    assert response.status_code == 503, f"{response.status_code} {response.text}\n{worker.output()}"
    err = assert_envelope(response, 503)
    assert err["code"] == "storage_unavailable", err
    assert "file store" in err["message"], err
    assert int(response.headers["retry-after"]) > 0


def _streamed_events(client: TestClient, tenant: Tenant, model_id: str) -> list[str]:
    body = chat_body(model_id, stream=True)
    with client.stream("POST", CHAT, json=body, headers=tenant.headers) as r:
        assert r.status_code == 200, r.read()
        return [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]


def test_completions_answer_503_while_s3_is_down(
    client: TestClient,
    tenant: Tenant,
    model_id: str,
    inference_worker: ServiceProcess,
    own_s3: SeaweedS3,
    session_factory: Any,
) -> None:
    _ready(inference_worker)
    requests = (
        (COMPLETIONS, {"model": model_id, "prompt": "x", "max_tokens": 4}),
        (CHAT, chat_body(model_id, max_tokens=4)),
        (f"/v1/models/{model_id}/generate", {"prompt": "x", "max_tokens": 4}),
    )
    own_s3.stop()  # SIGKILL, by PID: the model's weights were never loaded, so S3 must be read
    try:
        for path, body in requests:
            _unavailable(client.post(path, json=body, headers=tenant.headers), inference_worker)
        events = _streamed_events(client, tenant, model_id)
        assert events and "[DONE]" not in events, events
        assert json.loads(events[-1])["error"]["code"] == "storage_unavailable", events
    finally:
        own_s3.start()  # the same ports and data
    assert "Traceback" not in inference_worker.output(tail=200_000)  # an outage is a log line
    for path, body in requests:
        r = client.post(path, json=body, headers=tenant.headers)
        assert r.status_code == 200, f"{r.text}\n{inference_worker.output()}"
    assert count(session_factory, InferenceRequest, InferenceRequest.owner_id == tenant.owner_id) == 0
