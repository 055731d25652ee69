"""Collecting what a killed process left behind, at the API's start-up and every
`leftover_sweep_seconds` after (kill -9 runs no `finally`):

- temporary upload files in `work_dir/uploads` (api/uploads.py) not written for
  `upload_leftover_seconds`: a live upload writes to its file at least every
  upload_body_timeout_seconds, then stores it; keep the bound above the longest store;
- incomplete blobs whose writer's heartbeat stopped `blob_writer_timeout_seconds` ago, with their
  chunk rows and bytes (core/blob_gc.py; the workers' reapers collect them too).

Several API processes sweeping at once is harmless: a file is removed once, a blob by a conditional
DELETE. A sweep that fails (the database down) is logged and tried again at the next round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from core.settings import Settings

if TYPE_CHECKING:
    from core.blobstore import BlobStore

log = logging.getLogger("fromscratch.api")


def upload_dir(settings: Settings) -> Path:
    """Where uploads are spooled while they arrive (api/routes/files.py)."""
    return settings.work_path / "uploads"


def sweep_uploads(folder: Path, max_age: float) -> int:
    """Remove the temporary upload files not modified for `max_age` seconds; how many."""
    cutoff, removed = time.time() - max_age, 0
    for path in folder.glob("upload-*") if folder.is_dir() else ():
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # another API process took it first
            continue
    return removed


def collect_leftovers(
    settings: Settings, store: BlobStore, session_factory: sessionmaker[Session]
) -> tuple[int, int]:
    """One sweep: (temporary upload files removed, incomplete blobs deleted)."""
    files = sweep_uploads(upload_dir(settings), settings.upload_leftover_seconds)
    with session_factory() as session:
        blobs = store.gc_incomplete(
            session, writer_timeout=timedelta(seconds=settings.blob_writer_timeout_seconds)
        )
        session.commit()
    if files or blobs:
        log.info(
            "removed %d temporary upload files and %d incomplete blobs left by dead processes", files, blobs
        )
    return files, blobs


async def sweep_forever(settings: Settings, store: BlobStore, session_factory: sessionmaker[Session]) -> None:
    """Sweep now, then every leftover_sweep_seconds (the API's lifespan runs it as a task)."""
    while True:
        try:
            await run_in_threadpool(collect_leftovers, settings, store, session_factory)
        except Exception as exc:
            log.warning("could not collect the leftovers of dead processes: %s", exc)
        await asyncio.sleep(settings.leftover_sweep_seconds)
