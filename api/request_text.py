"""Text in requests, checked once before any route sees it: every string of a JSON body (keys
included) and the URL's path and query must be text the service can store and encode.

Two kinds of character pass the parsers and fail deep inside a route, as a 500:
- a lone surrogate (`"\\ud800"` in JSON, or CESU-8 bytes for one): Python's json module hands it
  on as `str`, and nothing downstream can encode it (the database driver, the tokenizer, even the
  JSON error message that would quote it);
- NUL (U+0000, `\\u0000` in JSON, `%00` in a URL): PostgreSQL text cannot hold it, so a query
  that compares an id or a cursor with it fails.
Here either is a 400 with code `invalid_text`, naming the field (`hyperparameters` for a bad key
inside it, `metadata.a` for a bad value, the query parameter; no id of this API holds either).

`json_router(...)` is an APIRouter for routes that take a JSON body (tests/api/test_openapi.py
checks none is missed): its routes are `CheckedJSONRoute`s, which hand FastAPI a `BoundedRequest`
(a body over `MAX_JSON_BODY_BYTES` is cut off with a 413 before it is read whole) and parse it
first, its nesting bounded by the setting `max_json_depth` (400 `json_too_deep` past it:
trainer.data.json_depth), into the request's `json()` cache (FastAPI does not parse it again).
`TextURLMiddleware` checks every request's URL.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import parse_qsl

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import APIError, error_response, quote_input
from trainer.data.json_depth import JSONPath, NumberTooLong, TooDeep, first_string_where, loads_bounded

MAX_JSON_BODY_BYTES = 1 << 20  # the largest valid body (a job with every hyperparameter) is ~2 KiB
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def is_storable(s: str) -> bool:
    return _UNSTORABLE.search(s) is None


def invalid_text(param: str | None, text: str) -> APIError:
    """The 400 for `text` (which holds a NUL or a lone surrogate) given as `param`."""
    bad = _UNSTORABLE.search(text)
    assert bad is not None
    char = bad.group()
    why = (
        "a NUL character (U+0000), which no text of this API may hold"
        if char == "\x00"
        else f"the lone surrogate U+{ord(char):04X}, which is not Unicode text (send UTF-8; a "
        "character outside the Basic Multilingual Plane is a surrogate pair in JSON)"
    )
    where = f"{param}: " if param else ""
    return APIError(
        400, f"{where}the text {quote_input(text, 80)} holds {why}", param=param, code="invalid_text"
    )


# -------------------------------------------------------------------------------------- JSON bodies
def first_unstorable_string(document: object) -> tuple[JSONPath, str] | None:
    """(path, the bad string) of the first string in `document` (keys included) that is not
    storable text, in document order; the path of a bad key is that of the object holding it."""
    return first_string_where(document, lambda s: not is_storable(s))


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def check_json_body(request: Request) -> None:
    """400 when the request's JSON body nests deeper than the setting `max_json_depth` or holds a
    string that is not storable text, or comes without a JSON Content-Type (curl's -d sends a
    form's; FastAPI would parse neither that nor none at all as JSON). A body that is not JSON at
    all is left to FastAPI, which answers it with its own 400."""
    body = await request.body()
    if not body:
        return
    content_type = request.headers.get("content-type")
    if not _is_json(content_type):
        came = quote_input(content_type.split(";", 1)[0].strip()) if content_type else "no Content-Type"
        raise APIError(
            400,
            f"The request body must be JSON, sent with Content-Type: application/json (it came with {came}).",
            code="invalid_content_type",
        )
    limit = request.app.state.settings.max_json_depth
    try:
        document = loads_bounded(body, limit)
    except TooDeep as e:
        raise APIError(
            400,
            f"The request body is JSON nested more than {limit} levels deep (setting "
            "FROMSCRATCH_MAX_JSON_DEPTH).",
            code="json_too_deep",
        ) from e
    except NumberTooLong as e:
        raise APIError(
            400, f"The request body's JSON holds {e}, more than any field takes.", code="invalid_json"
        ) from e
    except ValueError:  # malformed JSON: FastAPI's parse reports it (json_invalid)
        return
    request._json = document  # what FastAPI's parse reads (Request.json() caches it there)
    found = first_unstorable_string(document)
    if found is not None:
        path, bad = found
        raise invalid_text(".".join(str(p) for p in path) or None, bad)


def too_large() -> APIError:
    return APIError(
        413,
        f"The request body is larger than {MAX_JSON_BODY_BYTES} bytes.",
        code="too_large",
        headers={"Connection": "close"},  # the rest of the body is not read
    )


class BoundedRequest(Request):
    """A request whose body is read at most to MAX_JSON_BODY_BYTES (413 past that, or at once when
    the Content-Length says so) and within the setting request_read_timeout_seconds (408 past it);
    the body is cached as Starlette's own `body()` caches it."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            declared = self.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_JSON_BODY_BYTES:
                raise too_large()
            timeout = self.scope["app"].state.settings.request_read_timeout_seconds
            chunks = bytearray()
            with anyio.move_on_after(timeout) as reading:
                async for chunk in self.stream():
                    chunks += chunk
                    if len(chunks) > MAX_JSON_BODY_BYTES:
                        raise too_large()
            if reading.cancelled_caught:
                raise APIError(
                    408,
                    f"The request body did not arrive within {timeout:g} s "
                    "(setting FROMSCRATCH_REQUEST_READ_TIMEOUT_SECONDS).",
                    code="request_timeout",
                    headers={"Connection": "close"},
                )
            self._body = bytes(chunks)
        return self._body


class CheckedJSONRoute(APIRoute):
    """An APIRoute whose handler bounds the body and runs `check_json_body` first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            bounded = BoundedRequest(request.scope, request.receive)
            try:
                await bounded.body()  # whatever its content type: FastAPI reads it from the cache
            except ClientDisconnect as e:
                raise APIError(400, "The request ended before its body did.", code="request_aborted") from e
            await check_json_body(bounded)
            return await handler(bounded)

        return checked


def json_router(*, prefix: str, tags: list[str]) -> APIRouter:
    """A router for routes with JSON bodies (see the module docstring)."""
    return APIRouter(prefix=prefix, tags=list(tags), route_class=CheckedJSONRoute)


# --------------------------------------------------------------------------------------------- URLs
def url_problem(scope: Scope) -> APIError | None:
    """The 400 for a URL whose decoded path or query holds unstorable text, else None."""
    path = scope.get("path", "")
    if not is_storable(path):
        return invalid_text(None, path)
    query = scope.get("query_string", b"").decode("latin-1")
    if "%00" in query or "\x00" in query:  # what the URL decodes to is checked below, parameter by parameter
        for name, value in parse_qsl(query, keep_blank_values=True):
            if not is_storable(name):
                return invalid_text(None, name)
            if not is_storable(value):
                return invalid_text(name, value)
    return None


class TextURLMiddleware:
    """Pure ASGI middleware answering `url_problem`'s 400 before routing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = url_problem(scope) if scope["type"] == "http" else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = error_response(problem.status, problem.message, problem.param, problem.code)
        await response(scope, receive, send)
