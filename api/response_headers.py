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
- security headers on everything (the dashboard's files and the API's JSON alike): a strict
  `Content-Security-Policy` (`CSP`: this origin only, no inline script or style, no framing),
  `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`. The
  dashboard (api/static) runs under it: no inline script, handler or style attribute (util.js's
  `el()` sets styles through the CSSOM). One page is not ours: FastAPI's Swagger UI at `/docs`,
  which loads its script from a CDN and starts it inline: it gets `docs_policy(...)`, that CDN and
  the hash of exactly its inline script(s), computed from the page as served.
"""

from __future__ import annotations

import base64
import hashlib
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

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # index.html's empty favicon (`data:,`)
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
DOCS_PATH = "/docs"
DOCS_CDN = "https://cdn.jsdelivr.net"  # FastAPI's get_swagger_ui_html loads Swagger UI from it
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.S)


def docs_policy(html: bytes) -> str:
    """The CSP of the Swagger UI page `html`: its CDN, and its inline scripts by their hashes."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(html)
    )
    return "; ".join(
        (
            "default-src 'self'",
            f"script-src 'self' {DOCS_CDN} {hashes}",
            f"style-src 'self' {DOCS_CDN} 'unsafe-inline'",  # Swagger UI styles its own widgets
            "img-src 'self' data: https://fastapi.tiangolo.com",  # FastAPI's favicon
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        )
    )


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
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                headers.setdefault("Content-Security-Policy", CSP)
            await send(message)

        if scope.get("path") == DOCS_PATH and scope.get("method") == "GET":
            await self.app(scope, receive, _with_docs_policy(send_with_headers))
            return
        await self.app(scope, receive, send_with_headers)


def _with_docs_policy(send: Send) -> Send:
    """Hold the Swagger UI page's start until its body (one small message) is there, then send
    both, with the page's own CSP."""
    start: list[Message] = []

    async def send_docs(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.append(message)
            return
        if start and message["type"] == "http.response.body":
            head = start.pop()
            if not message.get("more_body", False):
                MutableHeaders(scope=head)["Content-Security-Policy"] = docs_policy(message.get("body", b""))
            await send(head)
        await send(message)

    return send_docs
