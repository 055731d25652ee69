"""Bring stored checkpoints (tars in the blob store) back onto the worker's disk: the job's own
newest one to resume from (`latest_checkpoint`) and the best evaluation's its run keeps in best/
(`restore_best`), or the final one of the model a job continues training from
(`base_model_checkpoint`). Storing them is `worker.checkpoint_store.store_checkpoint`."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.archives import extract_all
from core.models import Checkpoint, Job
from worker.failures import JobFailure

if TYPE_CHECKING:
    from core.blobstore import BlobStore


def latest_checkpoint(
    session_factory: sessionmaker[Session], store: BlobStore, job_id: str, dest: Path
) -> tuple[Path | None, int]:
    """Extract the newest stored checkpoint of this job (if any) under `dest`, its optimizer state
    included: (folder, step)."""
    with session_factory() as session:
        ckpt = session.execute(
            select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc()).limit(1)
        ).scalar_one_or_none()
        if ckpt is None:
            return None, 0
        blob_id, optimizer_blob_id, step = ckpt.blob_id, ckpt.optimizer_blob_id, ckpt.step
    folder = extract_checkpoint(store, blob_id, dest)
    if optimizer_blob_id is not None:  # stored beside the tar (checkpoints stored before: inside it)
        from trainer.checkpoint_snapshot import OPTIMIZER_FILE

        store.read_to_path(optimizer_blob_id, folder / OPTIMIZER_FILE)
    return folder, step


def restore_best(
    session_factory: sessionmaker[Session], store: BlobStore, job_id: str, resume_path: Path, run_dir: Path
) -> None:
    """Put the best evaluation's checkpoint of a resumed job back at `run_dir`/best, where its run
    keeps it (trainer.run.loop; an attempt's scratch folder starts empty): the stored checkpoint of
    the earlier step that the resume checkpoint names as best (worker.callbacks stores it with the
    step checkpoints after it). Without it, a run that ends past its best has its last step as the
    model, and says so."""
    from trainer.checkpoint import read_state  # torch: only on the training worker's path

    state = read_state(resume_path)
    best_step = state.get("best_step")
    if best_step is None or best_step >= state["step"]:
        return
    with session_factory() as session:
        blob_id = session.scalar(
            select(Checkpoint.blob_id).where(Checkpoint.job_id == job_id, Checkpoint.step == best_step)
        )
    if blob_id is None:
        return
    folder = extract_checkpoint(store, blob_id, run_dir / "best-restore")
    run_dir.mkdir(parents=True, exist_ok=True)
    folder.rename(run_dir / "best")
    shutil.rmtree(run_dir / "best-restore")


def base_model_checkpoint(
    session_factory: sessionmaker[Session], store: BlobStore, base_model_id: str, owner_id: str, dest: Path
) -> Path:
    """The final checkpoint folder of the model a job continues training from (a fine-tuned model
    id or a checkpoint's model id of the same owner), extracted under `dest`."""
    with session_factory() as session:
        parent = session.execute(
            select(Job).where(Job.fine_tuned_model == base_model_id, Job.owner_id == owner_id)
        ).scalar_one_or_none()
        query = select(Checkpoint).where(Checkpoint.owner_id == owner_id)
        if parent is not None:
            query = query.where(Checkpoint.job_id == parent.id, Checkpoint.is_final.is_(True))
        else:  # a checkpoint's model id
            query = query.where(Checkpoint.model_id == base_model_id)
        ckpt = session.execute(query.order_by(Checkpoint.step.desc()).limit(1)).scalar_one_or_none()
        if ckpt is None:
            raise JobFailure(
                "invalid_base_model",
                f"The model {base_model_id} has no stored weights any more "
                "(it was deleted); choose another model.",
                "model",
            )
        blob_id = ckpt.blob_id
    return extract_checkpoint(store, blob_id, dest)


def extract_checkpoint(store: BlobStore, blob_id: str, dest: Path) -> Path:
    """Unpack a checkpoint tar into a fresh `dest`; returns the one checkpoint folder inside it."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    tar_path = dest.with_suffix(".tar")
    store.read_to_path(blob_id, tar_path)
    try:
        with tarfile.open(tar_path) as tar:
            extract_all(tar, dest)
    finally:
        tar_path.unlink(missing_ok=True)
    folders = [p for p in dest.iterdir() if p.is_dir()]
    if len(folders) != 1:
        raise JobFailure("internal_error", "A stored checkpoint is damaged (unexpected archive layout).")
    return folders[0]
