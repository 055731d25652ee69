"""A worker forgets deleted data on its disk (worker/cache_sweep.py): the cached copy, tokens and
tokenizer of a deleted file and the extracted checkpoint of a deleted blob go; a live file's stay,
and so does anything used since the sweep began (data_cache touches what it reuses)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from core.blobstore import blobstore_from_settings
from core.models import File, utcnow
from core.settings import Settings
from worker.cache_sweep import sweep_work_dir
from worker.data_cache import fetch_file

AN_HOUR_AGO = time.time() - 3600


def _file(settings: Settings, session_factory: sessionmaker[Session], text: bytes, *, deleted: bool) -> File:
    """A File row with its blob (a deleted one keeps its row, its bytes freed, as the API leaves it)."""
    store = blobstore_from_settings(settings, session_factory)
    with session_factory() as session:
        blob = store.put([text], session)
        row = File(
            owner_id="owner-sweep",
            filename="data.txt",
            purpose="fine-tune",
            bytes=len(text),
            sha256=hashlib.sha256(text).hexdigest(),
            format="text",
            blob_id=blob.id,
        )
        session.add(row)
        session.flush()
        if deleted:
            row.blob_id, row.deleted_at = None, utcnow()
            session.flush()
            store.delete(blob.id, session)
        session.commit()
        session.refresh(row)
        session.expunge(row)
        return row


def _cached(work: Path, sha: str) -> list[Path]:
    """What data_cache and prepare_data keep of content `sha`, written an hour ago."""
    paths = [
        work / "cache" / "files" / sha,
        work / "cache" / "tokenizers" / f"{sha}-bpe-4096.json",
        work / "cache" / "tokens" / f"{sha[:32]}-0123456789abcdef-v3.tokens",
        work / "cache" / "tokens" / f"{sha[:32]}-0123456789abcdef-v3.tokens.spans",
    ]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        os.utime(path, (AN_HOUR_AGO, AN_HOUR_AGO))
    return paths


def _model_folder(work: Path, name: str) -> Path:
    folder = work / "models" / name
    (folder / "ckpt").mkdir(parents=True)
    (folder / ".complete").touch()
    os.utime(folder, (AN_HOUR_AGO, AN_HOUR_AGO))
    return folder


def test_deleted_files_and_models_leave_the_workers_disk(
    settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    work = settings.work_path
    live = _file(settings, session_factory, b"live text " * 50, deleted=False)
    gone = _file(settings, session_factory, b"deleted text " * 50, deleted=True)
    live_cache, gone_cache = _cached(work, live.sha256), _cached(work, gone.sha256)
    assert live.blob_id is not None
    live_model = _model_folder(work, live.blob_id)
    gone_model = _model_folder(work, "blob-deleted-long-ago")
    extracting = _model_folder(work, "blob-deleted-long-ago.tmp-123-ab")  # another process's, mid-way
    used_meanwhile = gone_cache[0].with_name(gone.sha256 + ".tmp-9")  # a download under way
    used_meanwhile.write_bytes(b"x")

    assert sweep_work_dir(session_factory, work) == len(gone_cache) + 1
    assert all(p.exists() for p in [*live_cache, live_model, extracting, used_meanwhile])
    assert not any(p.exists() for p in [*gone_cache, gone_model])
    assert sweep_work_dir(session_factory, work) == 0


def test_content_uploaded_again_keeps_what_a_job_reuses(
    settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    """A cached copy reused by a job is marked used, so a sweep that began before the content was
    uploaded again (and so does not find it live) leaves it."""
    work = settings.work_path
    again = _file(settings, session_factory, b"uploaded twice " * 50, deleted=False)
    (cached, *_) = _cached(work, again.sha256)
    store = blobstore_from_settings(settings, session_factory)
    assert fetch_file(session_factory, store, work / "cache", again.id, "training_file") == cached
    assert cached.stat().st_mtime > AN_HOUR_AGO + 60  # reused: touched

    # a sweep that started an hour ago, before the touch, and found the content deleted
    from worker import cache_sweep

    assert cache_sweep._remove(cached, before=AN_HOUR_AGO + 1) == 0
    assert cached.exists()
    assert cache_sweep._remove(cached, before=time.time() + 1) == 1  # untouched since: it goes
