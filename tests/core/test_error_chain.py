"""Walking a chain of causes ends, also on a chain that loops."""

from __future__ import annotations

import errno

from sqlalchemy import exc as sa_exc

from api.errors import storage_full
from core.blob_errors import is_store_outage
from core.broker_faults import is_broker_error
from core.db_faults import is_connection_error
from core.error_chain import error_chain


def _looped() -> ValueError:
    error = ValueError("raised from itself")
    error.__cause__ = error  # what `raise exc from exc` leaves
    return error


def test_a_looping_chain_is_walked_once() -> None:
    looped = _looped()
    assert list(error_chain(looped)) == [looped]
    outer = RuntimeError("outer")
    outer.__context__ = looped
    assert list(error_chain(outer)) == [outer, looped]
    assert list(error_chain(outer, contexts=False)) == [outer]
    # every question asked of such a chain ends, with the answer it would have without the loop
    assert not is_connection_error(looped) and not is_store_outage(looped)
    assert not is_broker_error(looped) and not storage_full(looped)


def test_the_cause_is_found_behind_the_error() -> None:
    refused = sa_exc.OperationalError("SELECT 1", {}, ConnectionRefusedError())
    wrapped = RuntimeError("the store failed")
    wrapped.__cause__ = refused
    assert is_connection_error(wrapped) and is_store_outage(wrapped)
    full = OSError(errno.ENOSPC, "No space left on device")
    later = ValueError("while writing")
    later.__context__ = full
    assert storage_full(later) and not storage_full(ValueError())
