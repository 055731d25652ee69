"""Where a job with `device: auto` trains (issue 23): on the GPU class when a GPU worker is alive
(a `workers` row, core/models.Worker, of a worker consuming the `gpu` queue, refreshed within
`lease_seconds`, with CUDA devices: worker/advertise.py writes `cuda` only for a worker that sees one), else on `default_queue`. So a
box whose only training worker has a GPU, such as `fromscratch serve` on an H100, places jobs there
with no setting, and admission then checks the job against the GPU class's memory. A job that names
its device keeps it; a job's queue is fixed once placed (a resume goes back to it). A job naming
`cuda` is refused at once where the gpu queue's live workers have no CUDA device (`fromscratch
serve` on a laptop consumes it with a CPU worker, which would fail the job); with no live worker of
that queue at all (GPU nodes still starting, or scaled to zero) it waits in the queue."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.device_queues import split_queue
from core.models import Worker
from core.settings import Settings


def _gpu_queue_device_kinds(session: Session, settings: Settings) -> set[str]:
    """The device kinds of the training workers of the gpu queue that advertised themselves within
    the last `lease_seconds` (an inference worker on a GPU does not count: it trains nothing)."""
    found = select(Worker.device_kind, Worker.queues).where(
        Worker.memory_bytes.is_not(None), Worker.alive(settings.lease_seconds)
    )
    return {
        kind for kind, queues in session.execute(found) if any(split_queue(q) == ("gpu", 1) for q in queues)
    }


def gpu_worker_alive(session: Session, settings: Settings) -> bool:
    """A live training worker of the gpu queue has a CUDA device (worker/advertise.py)."""
    return "cuda" in _gpu_queue_device_kinds(session, settings)


def gpu_queue_without_cuda(session: Session, settings: Settings) -> bool:
    """The gpu queue's live training workers, if any, all lack a CUDA device."""
    kinds = _gpu_queue_device_kinds(session, settings)
    return bool(kinds) and "cuda" not in kinds


def training_queue(session: Session, device: str, settings: Settings) -> str:
    """The training queue (cpu or gpu) of a job asking for `device` (cpu, cuda or auto)."""
    if device == "cuda":
        return "gpu"
    if device == "cpu":
        return "cpu"
    return "gpu" if gpu_worker_alive(session, settings) else settings.default_queue
