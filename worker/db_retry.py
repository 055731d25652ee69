"""Retrying a worker's database writes through a brief outage: `DbRetry`, one per component
(metrics writes, checkpoint writes, job updates, heartbeat), and `DatabaseUnavailable`.

Only connection-level errors are retried (core.db_faults.is_connection_error); anything else is
raised at once. Tries are spaced by a capped, jittered exponential backoff. Once the component has
not reached the database for `budget` seconds (the `db_retry_seconds` setting) it raises
`DatabaseUnavailable`: the worker gives the attempt up (worker.job_ending) and the job resumes from
its last checkpoint later, like after a crash. Every try opens a fresh session, so `fn` must be a
whole transaction that is safe to run again.

Two ways to use it:
- `call(fn)` blocks until fn succeeds (a checkpoint upload, a status change: nothing can go on
  without them);
- `try_once(fn)` tries at most once, and not before the backoff after the last failure has passed
  (metrics: the rows stay buffered and training goes on while the database is away).
`call` can be told to give up early: a `stop` event set while it retries ends the wait before the
next try with `RetryStopped` (a cancelled job's checkpoint upload: worker.checkpoint_uploads).
An outage is logged as two lines per component (core.db_faults.OutageLog), not a traceback a try.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from core.db_faults import OutageLog, is_connection_error

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_DELAY = 0.25  # seconds before the second try
MAX_DELAY = 5.0  # the backoff's cap: a recovered database is noticed within this


class DatabaseUnavailable(Exception):
    """The database (or `what` else a component needs: the blob store) stayed unreachable for the
    retry budget: give the attempt up (not the job)."""

    def __init__(self, component: str, seconds: float, what: str = "the database") -> None:
        super().__init__(f"{component}: {what} was unreachable for {seconds:.0f} s")
        self.component, self.seconds, self.what = component, seconds, what


class RetryStopped(Exception):
    """`call` stopped retrying because its `stop` event was set: the caller no longer needs the write."""

    def __init__(self, component: str) -> None:
        super().__init__(f"{component}: stopped retrying (no longer needed)")
        self.component = component


class DbRetry:
    def __init__(
        self,
        component: str,
        budget: float = math.inf,
        action: str = "retrying",
        *,
        retryable: Callable[[BaseException], bool] = is_connection_error,
        what: str | Callable[[BaseException], str] = "the database",
        stop: threading.Event | None = None,
    ) -> None:
        """`retryable`: the errors an outage raises (the database's connection errors unless given);
        `what` names what was away, in DatabaseUnavailable's message; `stop`, once set, makes `call`
        raise RetryStopped instead of trying again (it wakes a wait between tries at once)."""
        self.component = component
        self.budget = budget
        self.retryable, self.what = retryable, what
        self.outage = OutageLog(component, log, action)
        self._failures = 0
        self._next_try = 0.0
        self._stop = stop or threading.Event()  # never set unless given

    def call(self, fn: Callable[[], T]) -> T:
        """fn() until it succeeds; raises DatabaseUnavailable past the budget, RetryStopped once `stop`
        is set (a try in progress is not interrupted: the next one is not made)."""
        while True:
            try:
                result = fn()
            except Exception as error:
                if not self.retryable(error):
                    raise
                self._failed(error)
                if self._stop.wait(max(0.0, self._next_try - time.monotonic())):
                    raise RetryStopped(self.component) from error
                continue
            self._succeeded()
            return result

    def try_once(self, fn: Callable[[], object]) -> bool:
        """One try of fn(), unless still backing off: True when it ran and succeeded, False when it
        was skipped or failed to reach the database (try again later). Raises DatabaseUnavailable
        past the budget."""
        if self.outage.down and time.monotonic() < self._next_try:
            return False
        try:
            fn()
        except Exception as error:
            if not self.retryable(error):
                raise
            self._failed(error)
            return False
        self._succeeded()
        return True

    def _failed(self, error: Exception) -> None:
        away = self.what(error) if callable(self.what) else self.what
        self.outage.what = away.removeprefix("the ")  # named in the outage's log lines
        self.outage.failed(error)
        self._failures += 1
        down_for = self.outage.down_for()
        if down_for >= self.budget:
            raise DatabaseUnavailable(self.component, down_for, away) from error
        delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (self._failures - 1))
        delay = random.uniform(delay / 2, delay)  # jitter: many workers do not retry in step
        self._next_try = time.monotonic() + min(delay, self.budget - down_for)

    def _succeeded(self) -> None:
        self._failures = 0
        self.outage.reachable()
