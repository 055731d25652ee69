"""Collecting incomplete blobs: what a write that died (its process killed, its caller rolled
back) left in the database and beside it (chunk rows, a temp file, an unfinished S3 upload).

A blob is collected when its last sign of life is older than a bound: for a row that names its
writer, its `heartbeat_at` (refreshed while the write goes on: core/blob_writers.py) against
`writer_timeout`; for a row from before heartbeats were recorded, its `created_at` against
`older_than` (hours: such a write may still be running somewhere). Each blob is removed with a
conditional DELETE that checks again that it is still incomplete and silent, so a write completed
meanwhile (its caller's transaction sets complete=True) is never collected; chunk rows go with it
(ON DELETE CASCADE). Bytes outside the database are removed then; should that fail, the row is
kept (the savepoint rolls back) for the next round.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, and_, delete, or_, select
from sqlalchemy.orm import Session

from core.models import Blob, utcnow

if TYPE_CHECKING:
    from core.blob_backends import ExternalBackend

log = logging.getLogger(__name__)


def silent(older_than: timedelta, writer_timeout: timedelta | None) -> ColumnElement[bool]:
    """Incomplete, and no sign of life within the bounds (see the module docstring)."""
    now = utcnow()
    legacy = and_(Blob.heartbeat_at.is_(None), Blob.created_at < now - older_than)
    beat_before = now - (writer_timeout if writer_timeout is not None else older_than)
    return and_(Blob.complete.is_(False), or_(legacy, Blob.heartbeat_at < beat_before))


def collect_incomplete(
    session: Session,
    external: dict[str, ExternalBackend],
    older_than: timedelta,
    writer_timeout: timedelta | None,
) -> int:
    """Delete the silent incomplete blobs (rows in `session`, which the caller commits; bytes now);
    how many."""
    condition = silent(older_than, writer_timeout)
    rows = session.execute(select(Blob.id, Blob.backend, Blob.path).where(condition)).all()
    deleted = 0
    for blob_id, backend_name, path in rows:
        backend = external.get(backend_name) if backend_name != "db" and path is not None else None
        if backend_name != "db" and path is not None and backend is None:
            continue  # bytes on a backend this process cannot reach: leave the row for one that can
        with session.begin_nested() as savepoint:
            result = session.execute(delete(Blob).where(Blob.id == blob_id, condition))
            if not result.rowcount:  # type: ignore[attr-defined]
                continue  # completed, or refreshed, meanwhile
            if backend is not None and path is not None and not _remove(backend, path):
                savepoint.rollback()
                continue
        deleted += 1
    return deleted


def _remove(backend: ExternalBackend, path: str) -> bool:
    try:
        backend.remove(path)
        backend.remove_partial(path)
    except Exception as exc:
        log.warning("could not remove blob bytes at %s (%s): %s", path, backend.name, exc)
        return False
    return True
