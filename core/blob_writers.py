"""Signs of life from the processes writing blobs, so that a killed writer's incomplete blob is
told from one still being written within a minute, not after hours.

Every incomplete `blobs` row records its `writer` ("<host>:<pid>") and `heartbeat_at`. While a
BlobStore writes a blob (and until put() returns it complete), the blob's id sits in its
WriterHeartbeat, whose thread refreshes `heartbeat_at` every `interval` seconds in a short
transaction of its own: a write that stalls on a slow client or a slow S3 part keeps its row
alive, while the rows of a process that died stop being refreshed. `gc_incomplete` collects an
incomplete blob whose heartbeat is older than `blob_writer_timeout_seconds` (core/blob_gc.py).
The thread runs only while there is something to refresh.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from core.models import Blob, utcnow

log = logging.getLogger(__name__)


def writer_id() -> str:
    """This process, as a blob row names its writer (read at each write: a fork changes the pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class WriterHeartbeat:
    """The blobs this process is writing, kept alive by a thread while there are any."""

    def __init__(self, session_factory: sessionmaker[Session], interval: float) -> None:
        self.session_factory, self.interval = session_factory, interval
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, blob_id: str) -> None:
        with self._lock:
            self._live.add(blob_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="fromscratch-blob-heartbeat", daemon=True
                )
                self._thread.start()

    def discard(self, *blob_ids: str) -> None:
        with self._lock:
            self._live.difference_update(blob_ids)

    def beat(self) -> int:
        """Refresh the heartbeat of the blobs being written; how many rows it touched."""
        with self._lock:
            ids = sorted(self._live)
        if not ids:
            return 0
        with self.session_factory() as session:
            result = session.execute(
                update(Blob).where(Blob.id.in_(ids), Blob.complete.is_(False)).values(heartbeat_at=utcnow())
            )
            session.commit()
        return int(result.rowcount)  # type: ignore[attr-defined]

    def _run(self) -> None:
        while True:
            threading.Event().wait(self.interval)
            with self._lock:
                if not self._live:
                    self._thread = None  # the next add() starts a new one
                    return
            try:
                self.beat()
            except Exception as exc:  # the next beat tries again; the write itself goes on
                log.warning("could not refresh the heartbeat of the blobs being written: %s", exc)
