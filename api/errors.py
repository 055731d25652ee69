"""The one error shape of the API and the handlers that guarantee it.

Every error the service answers — a route's `APIError`, FastAPI's `HTTPException`, Starlette's 404
for an unknown path and 405 for a wrong method, a request that fails its typed model, an unhandled
exception — is JSON in OpenAI's envelope:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "training_file", "code": "..."}}

never HTML and never a stack trace. `type` follows OpenAI: `invalid_request_error` for 4xx caused by
the request (401 included, with code `invalid_api_key`), `server_error` for 5xx, `requests` for the
rate limit's 429 (code `rate_limit_exceeded`), as OpenAI types its request-rate limits.

A request that fails validation (its body, query or header against the route's types) is a 400,
as OpenAI answers, never FastAPI's 422: `param` is the field's dotted path (`seed`, `method.type`),
an unknown field is "Unrecognized request argument supplied: X" with code `unknown_parameter`.

We never answer 409 for a request that can never succeed (the openai SDK retries 408/409/429/5xx):
a state conflict such as cancelling a finished job is a 400.

Retries: api/response_headers.py puts `x-should-retry: false` on every 400/401/403/404/405/409/413/
422 and `Retry-After` on every 429/503, and `x-request-id` on everything. Here an APIError can say
itself whether a retry may help (`retry`: the header `x-should-retry: true|false`); a quota 429
(`quota_exceeded`) is `false` by default: a retry seconds later meets the same quota (job slots free
when jobs finish, storage when the owner deletes something), so the SDK raises at once instead of
waiting out its retries (`Retry-After` stays, for clients that schedule a later try themselves).
`max_completions_per_key`'s is `true`: completions end within seconds, so the SDK's retries after
`Retry-After` get through.
A throttling 429 (`rate_limit_exceeded`) and a 503 are retried by the SDK after `Retry-After`.
A full disk (ENOSPC, EDQUOT: an upload's temporary file, an fs blob) is a 507 `insufficient_storage`
with `x-should-retry: false`, not a 500 the SDK would retry.

An error quotes what the caller sent only in part: `quote_input` cuts a quoted value to
`MAX_QUOTED_CHARS`, `param` paths are cut the same way, and a message is never longer than
`MAX_MESSAGE_CHARS` (a 1 MB `model` value is not echoed back in a 1 MB error).
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.response_headers import REQUEST_ID_HEADER, SHOULD_RETRY_HEADER, request_id
from core.error_chain import error_chain

log = logging.getLogger("fromscratch.api")

_DEFAULT_TYPES = {401: "invalid_request_error", 403: "invalid_request_error", 404: "invalid_request_error"}
# error codes whose answer a retry cannot change, whatever their status (see the module docstring)
NOT_RETRYABLE_CODES = frozenset({"quota_exceeded"})


def error_type_for(status: int) -> str:
    if status >= 500:
        return "server_error"
    return _DEFAULT_TYPES.get(status, "invalid_request_error")


class APIError(Exception):
    """Raise from a route (or anything it calls) to answer `status` with the error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        retry: bool | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or error_type_for(status)
        if retry is None and code in NOT_RETRYABLE_CODES:
            retry = False
        if retry is not None:
            headers = {**(headers or {}), SHOULD_RETRY_HEADER: "true" if retry else "false"}
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="invalid_request_error (4xx), requests (the rate limit's 429) or server_error (5xx)"
    )
    param: str | None = Field(description="the request field at fault, dotted when nested (method.type)")
    code: str | None


class ErrorResponse(BaseModel):
    """The body of every error answer."""

    error: ErrorDetail


# For the OpenAPI document: every 5xx is this envelope; api/openapi.py adds the 4xx statuses each
# operation can answer (with the same envelope) and drops FastAPI's 422.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "5XX": {"model": ErrorResponse, "description": "The service could not answer (the message says why)"},
}


MAX_QUOTED_CHARS = 200
MAX_MESSAGE_CHARS = 2000


def quote_input(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """`repr(value)` for an error message, cut to about `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text) - limit + 40} characters cut)"


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": _cut(message, MAX_MESSAGE_CHARS),
            "type": type,
            "param": _cut(param, MAX_QUOTED_CHARS),
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    type: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(message, type or error_type_for(status), param, code), status_code=status, headers=headers
    )


def not_found(what: str, id: str, param: str | None = None) -> APIError:
    """404 for an id that does not exist *or belongs to another owner* (we do not tell them apart)."""
    return APIError(
        404, f"No such {what}: {quote_input(id)}", param=param, code=f"{what.replace(' ', '_')}_not_found"
    )


# ------------------------------------------------------------------------------------------ handlers
async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 401: "invalid_api_key", 413: "too_large"}


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail
    if status == 404 and detail == "Not Found" and api_methods(request):
        # the dashboard's files (mounted at /) answered a GET/HEAD for a path only other methods
        # serve, e.g. GET /v1/completions: that is a wrong method, not an unknown URL
        allowed = api_methods(request)
        if request.method not in allowed:
            status, detail = 405, "Method Not Allowed"
    if status == 404 and detail == "Not Found":
        message = f"Unknown URL: {request.method} {_quoted_path(request)}"
    elif status == 405 and detail == "Method Not Allowed":
        message = f"Method {request.method} is not allowed on {_quoted_path(request)}"
    elif isinstance(detail, str):
        message = detail
    else:
        message = str(detail)
    headers = getattr(exc, "headers", None)
    if status == 405 and (allowed := api_methods(request)):
        headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        message += f" (allowed: {', '.join(allowed)})"
    return error_response(status, message, code=_HTTP_CODES.get(status), headers=headers)


def api_methods(request: Request) -> list[str]:
    """The methods of the API path (`app.state.api_routes`) the request's path is an instance of.
    A wrong method on an API path falls through to the dashboard's static files, mounted at /,
    whose 405 would say `Allow: GET, HEAD` whatever the path. Of the templates that match, the
    most specific (most literal characters) is the path: /v1/models/x/content is that of the
    download, not a model id "x/content" (model routes take `{model_id:path}`)."""
    path = request.scope.get("path", "")
    routes = [r for r in getattr(request.app.state, "api_routes", ()) if r.path_regex.match(path)]
    if not routes:
        return []

    def literal_chars(route: APIRoute) -> int:
        return len(re.sub(r"\{[^}]*\}", "", route.path_format))

    best = max(literal_chars(r) for r in routes)
    return sorted({m for r in routes if literal_chars(r) == best for m in r.methods or ()})


def _quoted_path(request: Request) -> str:
    path = request.url.path
    return path if len(path) <= MAX_QUOTED_CHARS else path[: MAX_QUOTED_CHARS - 3] + "..."


_LOCATIONS = ("body", "query", "path", "header", "cookie", "form")
_SHOWN_INPUT_CHARS = 80


def _loc_param(loc: Sequence[int | str]) -> str | None:
    """FastAPI locations look like ("body", "method", "type") or ("query", "limit")."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    return _cut(".".join(parts), MAX_QUOTED_CHARS) or None


def _shown(value: object) -> str:
    return quote_input(value, _SHOWN_INPUT_CHARS)


def _describe_validation_error(err: Mapping[str, Any]) -> tuple[str | None, str, str]:
    """(param, message, code) of one pydantic error, in OpenAI's words where OpenAI has some."""
    kind = str(err.get("type", ""))
    loc = tuple(err.get("loc", ()))
    if kind == "json_invalid":  # loc is ("body", <character offset>)
        detail = (err.get("ctx") or {}).get("error", "invalid JSON")
        return None, f"The request body is not valid JSON: {detail}", "validation_error"
    param = _loc_param(loc)
    if kind == "extra_forbidden":
        return param, f"Unrecognized request argument supplied: {param}", "unknown_parameter"
    # JSON clients send null for "not given": a null where a value is needed reads as missing
    if kind == "missing" or ("input" in err and err["input"] is None and kind.endswith("_type")):
        return param, f"Missing required parameter: {param or 'the request body'}", "validation_error"
    message = str(err.get("msg", "invalid value"))
    if "input" in err:
        message += f" (got {_shown(err['input'])})"
    return param, f"{param}: {message}" if param else message, "validation_error"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    described = [_describe_validation_error(err) for err in exc.errors()] or [
        (None, "Invalid request", "validation_error")
    ]
    param, _, code = described[0]
    message = "; ".join(text for _, text, _ in described[:5])
    return error_response(400, message, param=param, code=code)


STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_full(error: BaseException) -> bool:
    """True for a full disk (or quota), also when raised from or while handling one."""
    return any(isinstance(seen, OSError) and seen.errno in STORAGE_FULL_ERRNOS for seen in error_chain(error))


async def _os_error(request: Request, exc: Exception) -> JSONResponse:
    """A full disk is a 507 the client cannot fix by retrying; any other OSError is a 500 (`_unhandled`,
    re-raised to Starlette's outermost handler). What was being written is removed on the way out
    (uploads' temporary files, partial blobs: api/uploads.py, core/blobstore.py)."""
    if not storage_full(exc):
        raise exc
    log.error("no storage space left: %s %s answered 507 (%s)", request.method, request.url.path, exc)
    return error_response(
        507,
        "The server has no storage space left for this request; nothing of it was kept. A retry "
        "fails the same way until space is freed (the operators see this in the server log).",
        code="insufficient_storage",
        # never retried, and what is left of an upload's body is not read
        headers={SHOULD_RETRY_HEADER: "false", "Connection": "close"},
    )


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    # Starlette answers this one outside every middleware: the request id is added here
    rid = request_id(request.scope)
    return error_response(
        500,
        "The server had an error while processing your request; it has been logged.",
        code="internal_error",
        headers={REQUEST_ID_HEADER: rid} if rid else None,
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OSError, _os_error)
    app.add_exception_handler(Exception, _unhandled)
