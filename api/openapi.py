"""The OpenAPI document (GET /openapi.json) as generated clients and fuzzers need it. FastAPI derives
paths, parameters and bodies from the routes; `install_openapi(app)` adds what it cannot see:

- security: `bearerAuth` (`Authorization: Bearer <key>`) on every operation whose route takes a key
  (api/deps.py), `apiKeyQuery` (`?api_key=`) besides it where the route accepts that (the stream),
  and `security: []` on the open ones;
- errors: each 4xx the operation can answer, with the error envelope (api/errors.py) as its body
  (`error_statuses`); every operation also has the `5XX` range. FastAPI's 422 goes: validation
  failures are 400 here;
- links: the id a create answers is the path parameter of the operations on what it created (and
  an uploaded file is the `training_file` of a new job), so stateful clients and schemathesis'
  stateful phase can follow them.

tests/api/test_openapi.py checks the document; tests/api/test_fuzz.py runs schemathesis against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from api.deps import get_current_key, get_stream_key
from api.request_text import CheckedJSONRoute

ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}
ERROR_DESCRIPTIONS = {
    400: "Invalid request: `error.param` names the field at fault",
    401: "No API key, or one that is malformed, unknown or revoked",
    404: "No such resource for this key's owner (another owner's ids read the same)",
    408: "The upload stalled: nothing arrived for `upload_body_timeout_seconds`",
    413: "The request body is larger than the service accepts",
    414: "The URL is longer than `max_request_line_bytes` (refused before the request is read)",
    429: "Over the key's rate limit or one of its quotas (`Retry-After` says when to try again)",
    431: "The request's headers pass `max_request_head_bytes`, `max_request_headers` or a line's bound",
}
SECURITY_SCHEMES = {
    "bearerAuth": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key (`fromscratch keys create --name NAME`), sent as `Authorization: Bearer <key>`",
    },
    "apiKeyQuery": {
        "type": "apiKey",
        "in": "query",
        "name": "api_key",
        "description": "The key in the URL, for a browser's EventSource (only the stream accepts it)",
    },
}
STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}

# (source method, source path) -> link name -> (target method, target path, link fields)
ID = "$response.body#/id"
LINKS: dict[tuple[str, str], dict[str, tuple[str, str, dict[str, Any]]]] = {
    ("POST", "/v1/files"): {
        "GetFile": ("GET", "/v1/files/{file_id}", {"parameters": {"file_id": ID}}),
        "DownloadFile": ("GET", "/v1/files/{file_id}/content", {"parameters": {"file_id": ID}}),
        "DeleteFile": ("DELETE", "/v1/files/{file_id}", {"parameters": {"file_id": ID}}),
        "TrainOnFile": (
            "POST",
            "/v1/fine_tuning/jobs",
            {
                "requestBody": {
                    "model": "llama-tiny",
                    "training_file": ID,
                    "hyperparameters": {"max_steps": 1},
                }
            },
        ),
    },
    ("POST", "/v1/fine_tuning/jobs"): {
        name: (method, path, {"parameters": {"job_id": ID}})
        for name, method, path in (
            ("GetJob", "GET", "/v1/fine_tuning/jobs/{job_id}"),
            ("CancelJob", "POST", "/v1/fine_tuning/jobs/{job_id}/cancel"),
            ("PauseJob", "POST", "/v1/fine_tuning/jobs/{job_id}/pause"),
            ("ResumeJob", "POST", "/v1/fine_tuning/jobs/{job_id}/resume"),
            ("ListJobEvents", "GET", "/v1/fine_tuning/jobs/{job_id}/events"),
            ("ListJobMetrics", "GET", "/v1/fine_tuning/jobs/{job_id}/metrics"),
            ("ListJobCheckpoints", "GET", "/v1/fine_tuning/jobs/{job_id}/checkpoints"),
        )
    },
}


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for dep in dependant.dependencies:
        if dep.call is not None:
            yield dep.call
        yield from _calls(dep)


def security_of(route: APIRoute) -> list[dict[str, list[str]]]:
    """The operation's `security`: [] for an open route."""
    calls = set(_calls(route.dependant))
    if get_stream_key in calls:
        return [{"bearerAuth": []}, {"apiKeyQuery": []}]
    if get_current_key in calls:
        return [{"bearerAuth": []}]
    return []


def error_statuses(route: APIRoute, method: str, operation: dict[str, Any]) -> set[int]:
    """The 4xx statuses an operation can answer, from what its route takes."""
    statuses: set[int] = {414, 431}  # any request: its head is bounded (api/http_server.py)
    params = operation.get("parameters", [])
    body = operation.get("requestBody")
    if body is not None or any(p.get("in") != "path" for p in params) or method in STATE_CHANGING:
        statuses.add(400)  # a value that does not fit, or a state the resource refuses
    if security_of(route):
        statuses |= {401, 429}
    if any(p.get("in") == "path" for p in params):
        statuses.add(404)
    if body is not None and "multipart/form-data" in body.get("content", {}):
        statuses.add(408)  # the upload is read as it streams in (api/uploads.py)
    if body is not None and isinstance(route, CheckedJSONRoute):
        statuses.add(413)  # over api.request_text.MAX_JSON_BODY_BYTES
    return statuses


def _operation_ids(paths: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {
        (method.upper(), path): op["operationId"]
        for path, ops in paths.items()
        for method, op in ops.items()
        if "operationId" in op
    }


def api_routes(routers: Iterable[APIRouter]) -> Iterator[APIRoute]:
    for router in routers:
        yield from (route for route in router.routes if isinstance(route, APIRoute))


def complete_openapi(doc: dict[str, Any], routers: Iterable[APIRouter]) -> None:
    """Add security, error answers and links to FastAPI's document of the app that includes
    `routers` (in place)."""
    paths: dict[str, Any] = doc.get("paths", {})
    routes = {
        (method, route.path_format): route
        for route in api_routes(routers)
        if route.include_in_schema
        for method in route.methods or ()
    }
    ids = _operation_ids(paths)
    for path, ops in paths.items():
        for method, op in ops.items():
            route = routes.get((method.upper(), path))
            if route is None:
                continue
            op["security"] = security_of(route)
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status in sorted(error_statuses(route, method.upper(), op)):
                responses.setdefault(
                    str(status),
                    {
                        "description": ERROR_DESCRIPTIONS[status],
                        "content": {"application/json": {"schema": ERROR_SCHEMA}},
                    },
                )
            links = LINKS.get((method.upper(), path))
            if links and "200" in responses:
                responses["200"]["links"] = {
                    name: {"operationId": ids[(target_method, target_path)], **fields}
                    for name, (target_method, target_path, fields) in links.items()
                }
    components = doc.setdefault("components", {})
    components["securitySchemes"] = SECURITY_SCHEMES
    schemas = components.get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):  # only FastAPI's dropped 422 used them
        schemas.pop(unused, None)


def install_openapi(app: FastAPI, routers: list[APIRouter]) -> None:
    """Serve FastAPI's document completed by `complete_openapi`, built on the first request for it.
    `routers`: those the app includes (their routes are the operations)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            complete_openapi(FastAPI.openapi(app), routers)  # FastAPI.openapi caches it in openapi_schema
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
