"""Forget deleted data on the worker's disk: what `work_dir` caches of content no live file holds
any more (`cache/files/<sha256>`, `cache/tokenizers/<sha256>-...`, `cache/tokens/<sha256[:32]>-...`:
worker/data_cache.py) and the checkpoints extracted for inference whose blob is gone
(`models/<blob id>/`: worker/model_cache.py). The reaper runs it on every worker (each node has its
own disk) every BLOB_GC_EVERY rounds.

A job starting meanwhile on content uploaded again keeps its entries: data_cache touches an entry
before it reuses it, and an entry is removed only when it was last written or touched before the
sweep began (looked at again right before its removal); content live when the sweep reads the
database is kept whatever its age. Several processes sweeping one folder at once is harmless (a
vanished entry is skipped).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.models import Blob, File

log = logging.getLogger(__name__)

# how each cache folder names its entries: the content's sha256 (or its first 32 hex digits) first
CACHE_KEYS: dict[str, Callable[[str], str]] = {
    "files": lambda name: name.split(".", 1)[0],
    "tokenizers": lambda name: name.split("-", 1)[0],
    "tokens": lambda name: name.split("-", 1)[0],
}


def sweep_work_dir(session_factory: sessionmaker[Session], work_dir: Path) -> int:
    """Delete the cache entries of deleted content and the extracted checkpoints of deleted blobs
    under `work_dir`; returns how many entries went."""
    started = time.time()
    candidates = [p for folder in (*CACHE_KEYS, "models") for p in _entries(work_dir, folder, started)]
    if not candidates:
        return 0
    with session_factory() as session:
        live_content = set(
            session.scalars(select(File.sha256).where(File.deleted_at.is_(None), File.blob_id.is_not(None)))
        )
        names = [p.name for p in candidates if p.parent.name == "models"]
        live_blobs = set(session.scalars(select(Blob.id).where(Blob.id.in_(names)))) if names else set()
    live_keys = live_content | {sha[:32] for sha in live_content}
    removed = 0
    for path in candidates:
        if path.parent.name == "models":
            gone = path.name not in live_blobs
        else:
            gone = CACHE_KEYS[path.parent.name](path.name) not in live_keys
        if gone:
            removed += _remove(path, started)
    if removed:
        log.info("removed %d cached entries of deleted files and models from %s", removed, work_dir)
    return removed


def _entries(work_dir: Path, folder: str, before: float) -> list[Path]:
    """The entries of work_dir/cache/<folder> (work_dir/models) last changed before `before`; a
    model folder still being extracted (`<blob>.tmp-...`) is not one."""
    root = work_dir / "models" if folder == "models" else work_dir / "cache" / folder
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    kept = []
    for path in entries:
        try:
            changed = path.stat().st_mtime
        except FileNotFoundError:
            continue
        if changed < before and ".tmp-" not in path.name:
            kept.append(path)
    return kept


def _remove(path: Path, before: float) -> int:
    """Remove `path` unless it was used since `before` (data_cache touches what it reuses)."""
    try:
        if path.stat().st_mtime >= before:
            return 0
        if path.is_dir():
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return 0
    return 1
