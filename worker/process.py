"""State a worker process shares across the jobs it runs: its database/blob-store handles
(`resources`), a fresh worker id per claim (`new_worker_id`) and the shutdown flag that the
SIGTERM/SIGINT handler sets (`request_shutdown`, read by the running job as `shutdown_event`)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from core.blobstore import BlobStore, blobstore_from_settings
from core.db import make_engine, make_session_factory
from core.settings import Settings

shutdown_event = threading.Event()


def request_shutdown() -> None:
    """Called from the worker's SIGTERM/SIGINT handler: the running job checkpoints and re-queues."""
    shutdown_event.set()


@dataclass
class Resources:
    session_factory: sessionmaker[Session]
    store: BlobStore


_resources: dict[tuple[str, str], Resources] = {}
_resources_lock = threading.Lock()


def resources(settings: Settings) -> Resources:
    """One engine, session factory and blob store per worker process (per settings)."""
    key = (settings.database_url, settings.model_dump_json())
    with _resources_lock:
        if key not in _resources:
            session_factory = make_session_factory(make_engine(settings.database_url))
            _resources[key] = Resources(session_factory, blobstore_from_settings(settings, session_factory))
        return _resources[key]


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
