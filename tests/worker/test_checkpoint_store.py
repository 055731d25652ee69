"""Stored checkpoints keep what a resume needs and no more (issue 22, item 5): the weights tar of
every kept checkpoint, and the optimizer state of the job's newest step checkpoint only, as a blob of
its own that the next checkpoint drops; a final checkpoint keeps none. The quota counts both blobs,
and a resume gets the optimizer state back beside the weights."""

from __future__ import annotations

import secrets
import tarfile
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from core.blobstore import BlobStore, blobstore_from_settings
from core.models import Blob
from core.quotas import stored_bytes
from core.settings import Settings
from tests.worker.helpers import checkpoint_rows
from tests.worker.test_quotas import _held_job, new_owner
from trainer.checkpoint_snapshot import OPTIMIZER_FILE
from worker.checkpoint_restore import latest_checkpoint
from worker.checkpoint_store import store_checkpoint


def _folder(root: Path, name: str, optimizer: bytes | None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(secrets.token_bytes(3000))
    (folder / "state.json").write_text('{"step": 1}\n')
    if optimizer is not None:
        (folder / OPTIMIZER_FILE).write_bytes(optimizer)
    return folder


def _blob_exists(session_factory: sessionmaker[Session], blob_id: str) -> bool:
    with session_factory() as s:
        return s.get(Blob, blob_id) is not None


def _store(session_factory: Any, store: BlobStore, job_id: str, folder: Path, step: int, **kw: Any) -> None:
    store_checkpoint(
        session_factory,
        store,
        job_id=job_id,
        worker_id="w-store",
        step=step,
        folder=folder,
        model_id=f"m-{job_id}:ckpt-step-{step}",
        metrics={"step": step},
        is_final=kw.pop("is_final", False),
        keep=10,
        **kw,
    )


def test_only_the_newest_checkpoint_keeps_its_optimizer_state(
    settings: Settings, session_factory: Any, tmp_path: Path
) -> None:
    owner = new_owner()
    job_id = _held_job(settings, session_factory, owner, "w-store")
    store = blobstore_from_settings(settings, session_factory)
    moments = [secrets.token_bytes(6000) for _ in range(3)]

    _store(session_factory, store, job_id, _folder(tmp_path / "a", "step-10", moments[0]), 10)
    (first,) = checkpoint_rows(session_factory, job_id)
    assert first.optimizer_blob_id is not None
    first_optimizer = first.optimizer_blob_id
    # the weights tar leaves the optimizer out; the optimizer blob is the file's bytes
    tar_path = store.read_to_path(first.blob_id, tmp_path / "w.tar")
    with tarfile.open(tar_path) as tf:
        assert sorted(tf.getnames()) == ["step-10", "step-10/model.safetensors", "step-10/state.json"]
    assert b"".join(store.open(first_optimizer)) == moments[0]
    with session_factory() as s:
        used = stored_bytes(s, owner)
        assert used == 100 + s.get(Blob, first.blob_id).size + len(moments[0])  # file, tar, optimizer

    _store(session_factory, store, job_id, _folder(tmp_path / "b", "step-00000020", moments[1]), 20)
    rows = {c.step: c for c in checkpoint_rows(session_factory, job_id)}
    assert rows[10].optimizer_blob_id is None and not _blob_exists(session_factory, first_optimizer)
    assert rows[20].optimizer_blob_id is not None

    # the best evaluation's (an older step) stored after it keeps no optimizer state, even given one
    _store(session_factory, store, job_id, _folder(tmp_path / "c", "best", moments[2]), 15)
    rows = {c.step: c for c in checkpoint_rows(session_factory, job_id)}
    assert rows[15].optimizer_blob_id is None and rows[20].optimizer_blob_id is not None

    # a resume gets the newest back with its optimizer state beside the weights
    folder, step = latest_checkpoint(session_factory, store, job_id, tmp_path / "restore")
    assert step == 20 and folder is not None
    assert (folder / OPTIMIZER_FILE).read_bytes() == moments[1]

    # the final checkpoint: the job is over, no checkpoint keeps optimizer state
    newest_optimizer = rows[20].optimizer_blob_id
    assert newest_optimizer is not None
    _store(session_factory, store, job_id, _folder(tmp_path / "d", "final", moments[2]), 30, is_final=True)
    assert all(c.optimizer_blob_id is None for c in checkpoint_rows(session_factory, job_id))
    assert not _blob_exists(session_factory, newest_optimizer)


def test_the_best_snapshot_of_a_step_keeps_that_steps_optimizer_state(
    settings: Settings, session_factory: Any, tmp_path: Path
) -> None:
    """An evaluation's new best at a checkpoint step stores a weights-only copy of that step after
    its step checkpoint: the row keeps the optimizer state a resume after a crash needs."""
    job_id = _held_job(settings, session_factory, new_owner(), "w-store")
    store = blobstore_from_settings(settings, session_factory)
    moment = secrets.token_bytes(6000)
    _store(session_factory, store, job_id, _folder(tmp_path / "a", "step-00000050", moment), 50)
    _store(session_factory, store, job_id, _folder(tmp_path / "b", "best", None), 50)
    (row,) = checkpoint_rows(session_factory, job_id)
    assert row.optimizer_blob_id is not None and b"".join(store.open(row.optimizer_blob_id)) == moment
    folder, step = latest_checkpoint(session_factory, store, job_id, tmp_path / "restore")
    assert step == 50 and folder is not None and (folder / OPTIMIZER_FILE).read_bytes() == moment
