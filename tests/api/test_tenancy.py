"""Another owner's ids read as 404 on every route; nothing about them leaks."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import Factory, Tenant
from tests.api.test_errors import assert_envelope


def test_every_route_hides_other_owners_ids(
    client: TestClient, tenant: Tenant, other: Tenant, factory: Factory
) -> None:
    file_id = factory.file(tenant.owner_id)
    job_id, model_id = factory.finished_model(tenant.owner_id)
    ckpt_model = f"{model_id}:ckpt-step-50"
    live_job = factory.job(tenant.owner_id, status="queued", file_id=file_id)
    routes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("get", f"/v1/files/{file_id}", None),
        ("get", f"/v1/files/{file_id}/content", None),
        ("delete", f"/v1/files/{file_id}", None),
        ("get", f"/v1/fine_tuning/jobs/{job_id}", None),
        ("get", f"/v1/fine_tuning/jobs/{job_id}/events", None),
        ("get", f"/v1/fine_tuning/jobs/{job_id}/metrics", None),
        ("get", f"/v1/fine_tuning/jobs/{job_id}/stream", None),
        ("get", f"/v1/fine_tuning/jobs/{job_id}/checkpoints", None),
        ("post", f"/v1/fine_tuning/jobs/{live_job}/cancel", None),
        ("post", f"/v1/fine_tuning/jobs/{live_job}/pause", None),
        ("post", f"/v1/fine_tuning/jobs/{live_job}/resume", None),
        ("get", f"/v1/models/{model_id}", None),
        ("get", f"/v1/models/{ckpt_model}", None),
        ("get", f"/v1/models/{model_id}/content?format=checkpoint", None),
        ("get", f"/v1/models/{model_id}/content?format=gguf", None),
        ("post", f"/v1/models/{model_id}/generate", {"prompt": "hi"}),
        ("delete", f"/v1/models/{model_id}", None),
        ("delete", f"/v1/models/{ckpt_model}", None),
    ]
    for method, path, body in routes:
        kwargs: dict[str, Any] = {"headers": other.headers}
        if body is not None:
            kwargs["json"] = body
        err = assert_envelope(client.request(method.upper(), path, **kwargs), 404)
        assert "owner" not in err["message"]
        # without a key: 401 before anything is looked up
        assert_envelope(client.request(method.upper(), path, **({"json": body} if body else {})), 401)
    # lists show nothing of the other owner
    for path in ("/v1/files", "/v1/fine_tuning/jobs", "/v1/models"):
        listed = client.get(path, headers=other.headers).json()["data"]
        assert [item for item in listed if item.get("kind") != "base"] == []  # the presets are everyone's
    # and the owner still sees everything (nothing was cancelled or deleted by the other key)
    assert client.get(f"/v1/fine_tuning/jobs/{live_job}", headers=tenant.headers).json()["status"] == "queued"
    assert client.get(f"/v1/models/{model_id}", headers=tenant.headers).status_code == 200
    assert client.get(f"/v1/files/{file_id}", headers=tenant.headers).status_code == 200
