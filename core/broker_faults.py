"""Telling a broker outage from a bug, and logging an outage once per component (the broker's
counterpart of core/db_faults.py).

`is_broker_error(exc)`: the broker could not be reached or dropped the connection (kombu's
OperationalError, which Celery's send raises once its retries are spent; redis-py's connection
errors and timeouts; a socket error; for the SQL transport, SQLAlchemy's OperationalError).

`BrokerOutageLog(component, logger)`: one warning when a component first fails to reach the broker
("broker unreachable: reaper (ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection
refused.)") and one when it reaches it again ("broker reachable again after 31 s: reaper"), instead
of a line or a traceback per failed try.
"""

from __future__ import annotations

import logging
import threading
import time

import kombu.exceptions
import redis.exceptions
from sqlalchemy import exc as sa_exc

from core.error_chain import error_chain

BROKER_ERRORS: tuple[type[BaseException], ...] = (
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,  # a restarted Redis loading its data
    sa_exc.OperationalError,  # the SQL transport's database
    OSError,
)


def is_broker_error(error: BaseException) -> bool:
    """True for connection-level broker errors (also when raised from one)."""
    return any(isinstance(seen, BROKER_ERRORS) for seen in error_chain(error))


def describe(error: BaseException) -> str:
    """`Type: first line of the message`, at most 200 characters, for a log line."""
    lines = str(error).strip().splitlines()
    first = lines[0][:200] if lines else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class BrokerOutageLog:
    """A component's view of the broker: up, or down since when. Thread-safe."""

    def __init__(self, component: str, logger: logging.Logger) -> None:
        self.component, self.logger = component, logger
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, error: BaseException | str) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        reason = error if isinstance(error, str) else describe(error)
        self.logger.warning("broker unreachable: %s (%s)", self.component, reason)

    def reachable(self) -> None:
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            self.logger.warning(
                "broker reachable again after %.0f s: %s", time.monotonic() - since, self.component
            )
