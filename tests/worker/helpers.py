"""Reading what a worker wrote: metrics, checkpoints, events (shared by the worker tests)."""

from __future__ import annotations

import math
import tarfile
from pathlib import Path
from typing import Any

from sqlalchemy import select

from core.archives import extract_all
from core.models import Blob, Checkpoint, Event, Metric

# ~50 steps of llama-tiny on CPU: seconds, with checkpoints and evaluations along the way.
SMALL_RUN = dict(
    max_steps=50,
    batch_size=4,
    checkpoint_every=10,
    eval_every=10,
    eval_batches=2,
    warmup_steps=5,
    log_every=1,
)


def long_run(max_steps: int, **extra: Any) -> dict[str, Any]:
    """A run long enough to act on while it trains."""
    return {**SMALL_RUN, "max_steps": max_steps, "eval_every": 50, **extra}


def metric_rows(session_factory: Any, job_id: str) -> list[Metric]:
    with session_factory() as session:
        rows = session.scalars(select(Metric).where(Metric.job_id == job_id).order_by(Metric.step)).all()
        session.expunge_all()
        return list(rows)


def checkpoint_rows(session_factory: Any, job_id: str) -> list[Checkpoint]:
    with session_factory() as session:
        rows = session.scalars(
            select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
        ).all()
        session.expunge_all()
        return list(rows)


def event_messages(session_factory: Any, job_id: str) -> list[str]:
    with session_factory() as session:
        return list(session.scalars(select(Event.message).where(Event.job_id == job_id).order_by(Event.seq)))


def assert_clean_series(rows: list[Metric], total_steps: int, max_gap: int = 1) -> None:
    """Unique, increasing steps from 1 to total_steps with no gap above max_gap; finite losses."""
    steps = [m.step for m in rows]
    assert steps, "no metrics were written"
    assert len(steps) == len(set(steps)), f"duplicate steps: {steps}"
    assert steps == sorted(steps)
    assert steps[0] <= max_gap and steps[-1] == total_steps, (steps[0], steps[-1])
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    assert max(gaps, default=1) <= max_gap, f"gap of {max(gaps)} steps in {steps}"
    for m in rows:
        assert m.train_loss is not None and math.isfinite(m.train_loss), (m.step, m.train_loss)
        if m.val_loss is not None:
            assert math.isfinite(m.val_loss)


def extract_checkpoint(session_factory: Any, store: Any, blob_id: str, dest: Path) -> Path:
    """Download a stored checkpoint tar and extract it; returns the checkpoint folder."""
    with session_factory() as session:
        blob = session.get(Blob, blob_id)
        assert blob is not None and blob.complete, f"blob {blob_id} missing or incomplete"
    tar_path = store.read_to_path(blob_id, dest / "ckpt.tar")
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        extract_all(tar, dest / "x")
    roots = {n.split("/")[0] for n in names}
    assert len(roots) == 1, f"the tar must hold one folder at its root, got {roots}"
    return dest / "x" / roots.pop()
