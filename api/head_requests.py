"""HEAD on every GET route (RFC 9110 section 9.3.2): the same status and headers as a GET, no body.
FastAPI routes answer only the methods they declare, so a HEAD answered 405. This pure ASGI
middleware runs the GET and passes on its start (status, headers, Content-Length) and an empty
body; a streamed download is stopped after its first piece, so a HEAD of a 1 GB model does not
read the gigabyte."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _BodyDropped(Exception):
    """Raised into the GET's stream once its head is sent: the rest is not wanted."""


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        finished = False

        async def head_only(message: Message) -> None:
            nonlocal finished
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] == "http.response.body" and not finished:
                finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                if message.get("more_body", False):
                    raise _BodyDropped
            elif finished and message["type"] == "http.response.body":
                raise _BodyDropped

        try:
            await self.app({**scope, "method": "GET"}, receive, head_only)
        except Exception:
            if not finished:  # an error before the head went out is the app's to report
                raise
