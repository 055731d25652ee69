"""Signs of life from the processes writing blobs, so that a killed writer's incomplete blob is
told from one still being written within a minute, not after hours.

Every incomplete `blobs` row records its `writer` ("<host>:<pid>") and `heartbeat_at`. While a
BlobStore writes a blob (and until put() returns it complete), the blob's id sits in its writers'
heartbeat (core/row_heartbeat.py), whose thread refreshes `heartbeat_at` every few seconds: a write
that stalls on a slow client or a slow S3 part keeps its row alive, while the rows of a process
that died stop being refreshed. `gc_incomplete` collects an incomplete blob whose heartbeat is
older than `blob_writer_timeout_seconds` (core/blob_gc.py).
"""

from __future__ import annotations

import os
import socket

from sqlalchemy.orm import Session, sessionmaker

from core.models import Blob
from core.row_heartbeat import RowHeartbeat


def writer_id() -> str:
    """This process, as a blob row names its writer (read at each write: a fork changes the pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def blob_heartbeat(session_factory: sessionmaker[Session], interval: float) -> RowHeartbeat:
    """The heartbeat of the blobs a store is writing (incomplete ones only)."""
    return RowHeartbeat(session_factory, interval, Blob, Blob.complete.is_(False))
