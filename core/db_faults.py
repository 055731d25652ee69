"""Telling a database outage from a bug, and logging an outage once per component.

`is_connection_error(exc)`: the database could not be reached or dropped the connection
(SQLAlchemy's OperationalError / InterfaceError / DisconnectionError, a DBAPI error that
invalidated its connection, a pool timeout). Worth retrying, and for the API a 503. Constraint
violations, SQL mistakes and other errors are not: retrying them would only repeat them.

`OutageLog(component, logger)`: one warning when a component first fails to reach the database
("database unreachable: metrics writes retrying (OperationalError: connection refused)") and one
when it reaches it again ("database reachable again after 23 s: metrics writes"), instead of a
traceback per failed try. Never logs SQL or parameters: only the driver's first message line.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import exc as sa_exc

from core.error_chain import error_chain

CONNECTION_ERRORS = (
    sa_exc.OperationalError,  # refused, reset, server shutting down or starting up, terminated
    sa_exc.InterfaceError,  # the driver's connection object is already closed
    sa_exc.DisconnectionError,  # the pool's pre-ping found the connection dead
    sa_exc.TimeoutError,  # no pooled connection came free in time
)


def is_connection_error(error: BaseException) -> bool:
    """True for connection-level database errors (also when raised `from` one)."""
    for seen in error_chain(error, contexts=False):
        if isinstance(seen, sa_exc.DBAPIError) and seen.connection_invalidated:
            return True
        if isinstance(seen, CONNECTION_ERRORS):
            return True
    return False


def describe(error: BaseException) -> str:
    """`Type: first line of the driver's message`, for a log line (never the SQL or parameters,
    which SQLAlchemy appends to its own message)."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip().splitlines()
    first = text[0][:200] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class OutageLog:
    """A component's view of the database: up, or down since when. Thread-safe."""

    def __init__(
        self, component: str, logger: logging.Logger, action: str = "retrying", what: str = "database"
    ) -> None:
        self.component, self.logger, self.action, self.what = component, logger, action, what
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._up_since = float("-inf")  # when it last came back (-inf: never went away)

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def down_for(self) -> float:
        """Seconds since the first failure of the current outage (0 when up)."""
        since = self._down_since
        return 0.0 if since is None else time.monotonic() - since

    def up_for(self) -> float:
        """Seconds since the database came back (inf when it never went away; 0 while down)."""
        return 0.0 if self.down else time.monotonic() - self._up_since

    def failed(self, error: BaseException) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        self.logger.warning(
            "%s unreachable: %s %s (%s)", self.what, self.component, self.action, describe(error)
        )

    def reachable(self) -> None:
        with self._lock:
            since = self._down_since
            if since is None:
                return
            self._down_since, self._up_since = None, time.monotonic()
        self.logger.warning(
            "%s reachable again after %.0f s: %s", self.what, self._up_since - since, self.component
        )
