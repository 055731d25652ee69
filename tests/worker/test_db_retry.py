"""worker.db_retry and core.db_faults without a server: which errors are retried, the backoff
gives up past its budget, an outage is two log lines, and a job's error never quotes SQL."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import exc as sa_exc

from core.db_faults import is_connection_error
from worker.db_retry import DatabaseUnavailable, DbRetry, RetryStopped
from worker.failures import classify_exception


class DriverError(Exception):
    """Stands in for the DBAPI's exception that SQLAlchemy wraps."""


def _operational() -> sa_exc.OperationalError:
    return sa_exc.OperationalError(
        "INSERT INTO blob_chunks (blob_id, seq, data) VALUES (%s, %s, %s)",
        ("blob-1", 0, b"\x00secret bytes"),
        DriverError("terminating connection due to administrator command\nmore detail"),
    )


def _integrity() -> sa_exc.IntegrityError:
    return sa_exc.IntegrityError("INSERT ...", {}, DriverError("duplicate key value"))


def test_connection_errors_are_told_from_bugs() -> None:
    assert is_connection_error(_operational())
    assert is_connection_error(sa_exc.InterfaceError("SELECT 1", {}, DriverError("connection closed")))
    invalidated = sa_exc.DBAPIError("SELECT 1", {}, DriverError("gone"), connection_invalidated=True)
    assert is_connection_error(invalidated)
    try:
        raise RuntimeError("wrapped") from _operational()
    except RuntimeError as wrapped:
        assert is_connection_error(wrapped)
    assert not is_connection_error(_integrity())
    assert not is_connection_error(sa_exc.ProgrammingError("SELEC 1", {}, DriverError("syntax error")))
    assert not is_connection_error(ValueError("nothing to do with the database"))


def test_call_retries_through_an_outage_and_logs_it_twice(caplog: pytest.LogCaptureFixture) -> None:
    tries = []

    def write() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise _operational()
        return "written"

    with caplog.at_level(logging.WARNING, logger="worker.db_retry"):
        assert DbRetry("metrics writes", budget=60).call(write) == "written"
    assert len(tries) == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("database unreachable: metrics writes retrying (OperationalError: ")
    assert lines[1].startswith("database reachable again after ") and lines[1].endswith(": metrics writes")
    assert not any("INSERT" in line or "secret" in line for line in lines)
    assert not any(r.exc_info for r in caplog.records)  # no traceback


def test_other_errors_are_not_retried() -> None:
    tries = []

    def write() -> None:
        tries.append(1)
        raise _integrity()

    with pytest.raises(sa_exc.IntegrityError):
        DbRetry("job updates", budget=60).call(write)
    assert len(tries) == 1


def test_gives_up_past_the_budget() -> None:
    def write() -> None:
        raise _operational()

    with pytest.raises(DatabaseUnavailable) as raised:
        DbRetry("checkpoint writes", budget=0.3).call(write)
    assert isinstance(raised.value.__cause__, sa_exc.OperationalError)
    assert raised.value.seconds >= 0.3


def test_a_stop_ends_the_retries_long_before_the_budget() -> None:
    """A cancelled job's checkpoint upload (worker.checkpoint_uploads): the stop event, set while
    `call` waits between tries, ends it with RetryStopped instead of the next try."""
    stop = threading.Event()
    tries: list[int] = []
    first_failed = threading.Event()

    def write() -> None:
        tries.append(1)
        first_failed.set()
        raise _operational()

    retry = DbRetry("checkpoint uploads", budget=3600, stop=stop)
    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: _keep_error(outcome, retry, write), daemon=True)
    thread.start()
    assert first_failed.wait(timeout=60)
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the retries went on after the stop"
    assert len(outcome) == 1 and isinstance(outcome[0], RetryStopped), outcome
    assert isinstance(outcome[0].__cause__, sa_exc.OperationalError)
    tried = len(tries)
    with pytest.raises(RetryStopped):  # once stopped, a failed try is not tried again
        retry.call(write)
    assert len(tries) == tried + 1


def _keep_error(outcome: list[BaseException], retry: DbRetry, write: Callable[[], None]) -> None:
    try:
        retry.call(write)
    except BaseException as error:
        outcome.append(error)


def test_try_once_waits_out_the_backoff_without_blocking() -> None:
    tries = []

    def write() -> None:
        tries.append(1)
        raise _operational()

    retry = DbRetry("metrics writes", budget=60)
    assert retry.try_once(write) is False
    assert retry.try_once(write) is False  # still backing off: not tried again
    assert len(tries) == 1
    assert retry.try_once(lambda: None) is False  # nor is a write that would succeed
    retry._next_try = 0.0  # the backoff has passed
    assert retry.try_once(lambda: None) is True
    assert not retry.outage.down


def test_an_internal_error_names_its_type_only() -> None:
    failure = classify_exception(_operational())
    assert failure.code == "internal_error"
    assert "OperationalError" in failure.message
    for leak in ("INSERT", "blob_chunks", "secret", "administrator"):
        assert leak not in failure.message, failure.message
