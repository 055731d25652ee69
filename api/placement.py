"""Where a job with `device: auto` trains (issue 23): on the GPU class when a GPU worker is alive
(a `workers` row, core/models.Worker, of a worker consuming the `gpu` queue, refreshed within
`lease_seconds`, with CUDA devices: worker/advertise.py writes `cuda` only for a worker that sees one), else on `default_queue`. So a
box whose only training worker has a GPU, such as `fromscratch serve` on an H100, places jobs there
with no setting, and admission then checks the job against the GPU class's memory. A job that names
its device keeps it; a job's queue is fixed once placed (a resume goes back to it)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.device_queues import split_queue
from core.models import Worker, utcnow
from core.settings import Settings


def gpu_worker_alive(session: Session, settings: Settings) -> bool:
    """A training worker of the gpu queue with a CUDA device advertised itself within the last
    `lease_seconds` (an inference worker on a GPU does not count: it trains nothing)."""
    since = utcnow() - timedelta(seconds=settings.lease_seconds)
    found = select(Worker.queues).where(
        Worker.device_kind == "cuda", Worker.memory_bytes.is_not(None), Worker.seen_at >= since
    )
    return any(split_queue(q) == ("gpu", 1) for queues in session.scalars(found) for q in queues)


def training_queue(session: Session, device: str, settings: Settings) -> str:
    """The training queue (cpu or gpu) of a job asking for `device` (cpu, cuda or auto)."""
    if device == "cuda":
        return "gpu"
    if device == "cpu":
        return "cpu"
    return "gpu" if gpu_worker_alive(session, settings) else settings.default_queue
