"""The OpenAPI document tells clients and fuzzers what they need (api/openapi.py): the bearer scheme,
the multipart upload body, every 4xx each operation can answer with the error envelope, and links."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from api.request_text import CheckedJSONRoute
from api.routes import (
    checkpoints,
    completions,
    events,
    files,
    health,
    hyperparameters,
    jobs,
    models,
    statuses,
)

ENVELOPE = {"$ref": "#/components/schemas/ErrorResponse"}
OPEN = {"/healthz", "/readyz", "/metrics"}


@pytest.fixture
def spec(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), path, op) for path, ops in spec["paths"].items() for m, op in ops.items()]


def test_security_schemes(spec: dict[str, Any]) -> None:
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKeyQuery"]["in"] == "query" and schemes["apiKeyQuery"]["name"] == "api_key"
    for method, path, op in operations(spec):
        if path in OPEN:
            assert op["security"] == [], path
        elif path.endswith("/stream"):
            assert op["security"] == [{"bearerAuth": []}, {"apiKeyQuery": []}]
        else:
            assert op["security"] == [{"bearerAuth": []}], (method, path)


def test_upload_body_is_multipart_with_its_fields(spec: dict[str, Any]) -> None:
    body = spec["paths"]["/v1/files"]["post"]["requestBody"]
    schema = body["content"]["multipart/form-data"]["schema"]
    assert body["required"] is True and set(schema["required"]) == {"file", "purpose"}
    assert schema["properties"]["file"] == {
        **schema["properties"]["file"],
        "type": "string",
        "format": "binary",
    }
    assert schema["properties"]["purpose"]["const"] == "fine-tune" or schema["properties"]["purpose"].get(
        "enum"
    ) == ["fine-tune"]


def test_every_operation_documents_its_4xx_with_the_envelope(spec: dict[str, Any]) -> None:
    head = {"414", "431"}  # every request's head is bounded (api/http_server.py)
    expected = {
        ("POST", "/v1/files"): {"400", "401", "408", "429"} | head,
        ("GET", "/v1/files/{file_id}"): {"401", "404", "429"} | head,
        ("DELETE", "/v1/files/{file_id}"): {"400", "401", "404", "429"} | head,
        ("POST", "/v1/fine_tuning/jobs"): {"400", "401", "413", "429"} | head,
        ("POST", "/v1/fine_tuning/jobs/{job_id}/cancel"): {"400", "401", "404", "429"} | head,
        ("GET", "/v1/fine_tuning/jobs/{job_id}/metrics"): {"400", "401", "404", "429"} | head,
        ("GET", "/v1/fine_tuning/jobs/{job_id}/stream"): {"400", "401", "404", "429"} | head,
        ("POST", "/v1/models/{model_id}/generate"): {"400", "401", "404", "413", "429"} | head,
        ("POST", "/v1/completions"): {"400", "401", "404", "413", "429"} | head,
        ("POST", "/v1/chat/completions"): {"400", "401", "404", "413", "429"} | head,
        ("GET", "/healthz"): head,
    }
    for method, path, op in operations(spec):
        responses = op["responses"]
        assert "422" not in responses and "4XX" not in responses, (method, path)
        assert responses["5XX"]["content"]["application/json"]["schema"] == ENVELOPE
        four = {code for code in responses if code.startswith("4")}
        for code in four:
            assert responses[code]["content"]["application/json"]["schema"] == ENVELOPE, (method, path, code)
        if (method, path) in expected:
            assert four == expected[(method, path)], (method, path, four)
        if path not in OPEN:
            assert {"401", "429"} <= four, (method, path)
        if "{" in path:
            assert "404" in four, (method, path)
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_links_name_real_operations(spec: dict[str, Any]) -> None:
    ids = {op["operationId"]: (method, path, op) for method, path, op in operations(spec)}
    links = spec["paths"]["/v1/files"]["post"]["responses"]["200"]["links"]
    links |= spec["paths"]["/v1/fine_tuning/jobs"]["post"]["responses"]["200"]["links"]
    assert {"GetFile", "TrainOnFile", "GetJob", "CancelJob", "ListJobMetrics"} <= set(links)
    for name, link in links.items():
        method, path, op = ids[link["operationId"]]
        for param in link.get("parameters", {}):
            assert f"{{{param}}}" in path, (name, path)
        if "requestBody" in link:
            assert "requestBody" in op, name


def test_every_route_with_a_json_body_checks_it() -> None:
    """Routes that take a JSON body are CheckedJSONRoutes (api/request_text.py): their strings are
    checked once for lone surrogates and their size is bounded."""
    routers = (health, files, jobs, hyperparameters, statuses, events, checkpoints, models, completions)
    with_body = [
        route
        for module in routers
        for route in module.router.routes
        if isinstance(route, APIRoute) and route.body_field is not None
    ]
    assert {r.path for r in with_body} >= {
        "/v1/fine_tuning/jobs",
        "/v1/models/{model_id:path}/generate",
        "/v1/completions",
        "/v1/chat/completions",
    }
    assert all(isinstance(r, CheckedJSONRoute) for r in with_body), [
        r.path for r in with_body if not isinstance(r, CheckedJSONRoute)
    ]
