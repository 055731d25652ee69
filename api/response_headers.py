"""Headers every response carries, set in one pure ASGI middleware (streams pass through untouched):

- `x-request-id`: the client's `X-Request-Id` when it is sane (1-128 characters of letters, digits
  and `._:+/=-`), else a new `req_<32 hex>`. Errors, streams and the dashboard's static files get
  it too; a 500 answered by Starlette's outermost error middleware gets it from
  api/errors.py's handler, which reads `request_id(scope)`.
- `x-should-retry: false` on answers a retry can never change (400, 401, 403, 404, 405, 409, 413,
  422), unless the answer says otherwise itself: the openai SDK obeys the header before its own
  rules (which retry 408, 409, 429 and 5xx). api/errors.py sets it on quota 429s as well.
- `Retry-After` on every 429 and 503 (`DEFAULT_RETRY_AFTER_SECONDS` when the answer has none of
  its own): the SDK waits that long before it retries.
"""

from __future__ import annotations

import re
import secrets

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
SHOULD_RETRY_HEADER = "x-should-retry"
NEVER_RETRY = frozenset({400, 401, 403, 404, 405, 409, 413, 422})
THROTTLED = frozenset({429, 503})
DEFAULT_RETRY_AFTER_SECONDS = 5
_SCOPE_KEY = "fromscratch.request_id"
_SANE_ID = re.compile(r"[A-Za-z0-9._:+/=-]{1,128}")


def new_request_id() -> str:
    return f"req_{secrets.token_hex(16)}"


def request_id(scope: Scope) -> str | None:
    """The id the middleware gave this request (None outside it)."""
    value = scope.get(_SCOPE_KEY)
    return value if isinstance(value, str) else None


class ResponseHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = Headers(scope=scope).get(REQUEST_ID_HEADER)
        rid = sent if sent is not None and _SANE_ID.fullmatch(sent) else new_request_id()
        scope[_SCOPE_KEY] = rid

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                headers = MutableHeaders(scope=message)
                headers[REQUEST_ID_HEADER] = rid
                status = int(message["status"])
                if status in NEVER_RETRY and SHOULD_RETRY_HEADER not in headers:
                    headers[SHOULD_RETRY_HEADER] = "false"
                if status in THROTTLED and "retry-after" not in headers:
                    headers["Retry-After"] = str(DEFAULT_RETRY_AFTER_SECONDS)
            await send(message)

        await self.app(scope, receive, send_with_headers)
