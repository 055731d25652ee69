"""503, not 500, while the database is unreachable.

A request that meets a connection-level database error (core.db_faults: refused, dropped,
shutting down, no pooled connection free in time) answers 503 in the error envelope with code
`database_unavailable` and `Retry-After`, from a regular exception handler, so the response is
complete and the kept-alive connection stays open (an error that reaches Starlette's
ServerErrorMiddleware is re-raised after its 500 and the server drops the connection).

The outage is logged once when the first request meets it and once when the engine connects again
("database reachable again after 23 s: API"), not a traceback per request. Nothing to restart: the
pool pre-pings and replaces dead connections.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Engine, event

from api.errors import error_response
from core.db_faults import CONNECTION_ERRORS, OutageLog

log = logging.getLogger("fromscratch.api")

RETRY_AFTER_SECONDS = 5
UNAVAILABLE_MESSAGE = "The database is temporarily unavailable. Retry the request in a few seconds."


def database_unavailable_response() -> JSONResponse:
    return error_response(
        503,
        UNAVAILABLE_MESSAGE,
        code="database_unavailable",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def install_database_error_handler(app: FastAPI, engine: Engine) -> None:
    outage = OutageLog("API", log, action="requests answered 503")

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        outage.failed(exc)
        return database_unavailable_response()

    for error_class in CONNECTION_ERRORS:
        app.add_exception_handler(error_class, unavailable)
    # a new connection means the database answers again (the pool drops dead ones first)
    event.listen(engine, "connect", lambda *_: outage.reachable())
