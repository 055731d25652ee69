"""The HTTP protocol the API is served with: uvicorn's h11 protocol with bounded request heads.

uvicorn's default protocol (httptools, with `uvicorn[standard]`) buffers a request head of any size:
one client sending a 100 MB header held the event loop for seconds (`/healthz` took 18 s) and grew
the process by 90 MB. Here a head is refused, before any of its body is read and before the app
sees it, when it passes one of three bounds (settings, `FROMSCRATCH_MAX_REQUEST_*`):

- `max_request_head_bytes`: the request line and every header together (h11 stops buffering an
  incomplete head at this size; a complete one is measured once parsed) -> 431;
- `max_request_headers`: how many header fields -> 431;
- `max_request_line_bytes`: one header line -> 431, the request target (URL) -> 414.

The answer is the API's error envelope, `x-should-retry: false` and `Connection: close`: the rest of
what the client sends is never read. A head that has not arrived whole `request_read_timeout_seconds`
after the connection opened (or after the previous response) is a 408 the same way, and the
connection is closed: a client trickling its headers cannot hold a connection open for ever.
Everything else is uvicorn's H11Protocol as it is.

Every server of the API names it: the Dockerfile and docker-compose.yml
(`uvicorn ... --http api.http_server:BoundedHeadProtocol`, `PROTOCOL` below), `fromscratch serve`
(cli/serve.py) and the tests' live servers (tests/test_compose.py checks the first two).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.errors import error_body
from core.settings import Settings, get_settings

PROTOCOL = "api.http_server:BoundedHeadProtocol"  # uvicorn's --http value for it
# seconds open connections (event streams) get to finish once the server is told to stop; the
# Dockerfile's and compose's `--timeout-graceful-shutdown` and `fromscratch serve` use it
GRACEFUL_SHUTDOWN_SECONDS = 5
log = logging.getLogger("fromscratch.api")


@dataclass(frozen=True)
class HeadLimits:
    head_bytes: int
    headers: int
    line_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> HeadLimits:
        return cls(
            settings.max_request_head_bytes, settings.max_request_headers, settings.max_request_line_bytes
        )

    def problem(self, request: h11.Request) -> tuple[int, str] | None:
        """(status, message) when a parsed request head passes a bound, else None."""
        if len(request.target) > self.line_bytes:
            return 414, (
                f"The request URL is over {self.line_bytes} bytes (setting FROMSCRATCH_MAX_REQUEST_LINE_BYTES)."
            )
        if len(request.headers) > self.headers:
            return 431, (
                f"The request has {len(request.headers)} header fields, over the limit of {self.headers} "
                "(setting FROMSCRATCH_MAX_REQUEST_HEADERS)."
            )
        longest = max((len(name) + len(value) + 2 for name, value in request.headers), default=0)
        if longest > self.line_bytes:
            return 431, (
                f"A request header line is over {self.line_bytes} bytes "
                "(setting FROMSCRATCH_MAX_REQUEST_LINE_BYTES)."
            )
        total = len(request.target) + sum(len(n) + len(v) + 4 for n, v in request.headers)
        if total > self.head_bytes:
            return 431, self.too_long()
        return None

    def too_long(self) -> str:
        return (
            f"The request line and headers are over {self.head_bytes} bytes "
            "(setting FROMSCRATCH_MAX_REQUEST_HEAD_BYTES)."
        )


class BoundedConnection(h11.Connection):
    """An h11 server connection that refuses a head passing `limits`; `refused` says why."""

    def __init__(self, limits: HeadLimits, on_request: Callable[[], None]) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.head_bytes)
        self.limits = limits
        self.on_request = on_request  # a whole request head has arrived
        self.refused: tuple[int, str] | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:
            if e.error_status_hint == 431:  # h11's own bound: the incomplete head outgrew head_bytes
                self.refused = (431, self.limits.too_long())
            raise
        if isinstance(event, h11.Request):
            self.on_request()
            self.refused = self.limits.problem(event)
            if self.refused is not None:
                raise h11.RemoteProtocolError(self.refused[1], error_status_hint=self.refused[0])
        return event


class BoundedHeadProtocol(H11Protocol):
    """uvicorn's H11Protocol on a BoundedConnection, answering a refused head in the error envelope."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.conn = BoundedConnection(HeadLimits.from_settings(settings), self._head_arrived)
        self.head_timeout = settings.request_read_timeout_seconds
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        self._await_head()  # first: a pipelined request that super() parses cancels it
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._head_arrived()
        self.head_timer = self.loop.call_later(self.head_timeout, self._head_too_slow)

    def _head_arrived(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_too_slow(self) -> None:
        """No whole head in time: a 408 when part of one came (an idle connection just closes)."""
        self.head_timer = None
        if self.transport.is_closing():
            return
        if self.conn.trailing_data[0]:
            message = (
                f"The request head did not arrive within {self.head_timeout:g} s "
                "(setting FROMSCRATCH_REQUEST_READ_TIMEOUT_SECONDS)."
            )
            log.warning("request head timed out from %s", _client(self.client))
            self.transport.write(_raw_response(408, "request_timeout", message))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        assert isinstance(self.conn, BoundedConnection)
        refused = self.conn.refused
        if refused is None:  # any other malformed request: uvicorn's plain 400
            super().send_400_response(msg)
            return
        status, message = refused
        log.warning("request head refused (%d) from %s: %s", status, _client(self.client), message)
        code = "url_too_long" if status == 414 else "request_head_too_large"
        body = json.dumps(error_body(message, "invalid_request_error", code=code)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-should-retry", b"false"),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


def _client(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "unknown client"


def _raw_response(status: int, code: str, message: str) -> bytes:
    """A whole error response in the API's envelope, written past h11's state machine (the
    connection is closed after it, mid-request)."""
    body = json.dumps(error_body(message, "invalid_request_error", code=code)).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-should-retry: false\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body
