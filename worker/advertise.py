"""A worker advertises what it has (issue 12): its `workers` row (core/models.Worker) holds its
queues, device kind and count and the memory of one device. Inserted when it starts, `seen_at`
refreshed every heartbeat_seconds by a daemon thread, deleted when it stops; each refresh also
deletes the rows of workers not seen for lease_seconds (they died without saying so). A database
outage only skips beats: advertising never stops a worker. Read by `GET /v1/workers`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from core.models import Worker, utcnow
from core.settings import QUEUES, Settings
from worker.devices import available_devices, device_kind
from worker.inference_device import inference_device

log = logging.getLogger(__name__)


def device_memory(kind: str, devices: int) -> int | None:
    """Bytes of one device: the smallest of the CUDA devices used, or the machine's memory on CPU."""
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            return None
        count = min(devices, torch.cuda.device_count())
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(count)) if count else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class Advertiser(threading.Thread):
    """Keeps this worker's row fresh until `stop()`."""

    def __init__(
        self, session_factory: sessionmaker[Session], row: Worker, interval: float, stale_after: float
    ) -> None:
        super().__init__(name="fromscratch-advertiser", daemon=True)
        self.session_factory, self.row = session_factory, row
        self.interval, self.stale_after = interval, stale_after
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.beat()
            self._stopping.wait(self.interval)

    def beat(self) -> None:
        """Upsert this worker's row (seen now) and drop the rows of workers gone silent."""
        now = utcnow()
        try:
            with self.session_factory() as session:
                row = session.get(Worker, self.row.id)
                if row is None:
                    row = Worker(
                        id=self.row.id,
                        host=self.row.host,
                        pid=self.row.pid,
                        queues=list(self.row.queues),
                        device_kind=self.row.device_kind,
                        devices=self.row.devices,
                        memory_bytes=self.row.memory_bytes,
                        started_at=self.row.started_at,
                    )
                    session.add(row)
                row.seen_at = now
                session.execute(
                    delete(Worker).where(
                        Worker.seen_at < now - timedelta(seconds=self.stale_after), Worker.id != self.row.id
                    )
                )
                session.commit()
        except Exception as exc:  # the next beat tries again; the worker keeps working
            log.warning("worker %s: could not advertise itself (%s)", self.row.id, type(exc).__name__)

    def stop(self) -> None:
        """Stop refreshing and delete the row: the worker is gone."""
        self._stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=self.interval + 5)
        try:
            with self.session_factory() as session:
                session.execute(delete(Worker).where(Worker.id == self.row.id))
                session.commit()
        except Exception as exc:  # its row expires after lease_seconds anyway
            log.warning("worker %s: could not remove its row (%s)", self.row.id, type(exc).__name__)


def start_advertising(settings: Settings, node_name: str, devices: int, queues: list[str]) -> Advertiser:
    """Insert this worker's row and keep it fresh (a daemon thread); `stop()` when the worker exits."""
    from worker.process import resources

    training = any(q in QUEUES for q in settings.queues)
    kind = device_kind(settings) if training else inference_device(settings.inference_device).kind
    if kind == "cuda" and available_devices("cuda") == 0:
        kind = "cpu"  # a gpu worker without CUDA runs on CPU (worker/devices.py keeps it working)
    row = Worker(
        id=node_name,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=queues,
        device_kind=kind,
        devices=devices,
        memory_bytes=device_memory(kind, devices),
        started_at=utcnow(),
    )
    advertiser = Advertiser(
        resources(settings).session_factory, row, settings.heartbeat_seconds, settings.lease_seconds
    )
    advertiser.beat()  # the row exists before the worker takes its first job
    advertiser.start()
    return advertiser
