"""What a training worker has (issue 12): the devices it runs one job on, and so the broker queues
it consumes (core/device_queues.py: `gpu`, `gpu.2`, ... up to its count).

A gpu worker counts its CUDA devices (CUDA_VISIBLE_DEVICES and the container's device reservation
decide what it sees); a cpu worker has 1 unless `worker_devices` says more (one process per
device, at most one per core). `worker_devices` above what the machine has is refused at start,
so a worker never consumes a queue whose jobs it could not run: a job never half-starts.
"""

from __future__ import annotations

import os

from core.device_queues import consumed_queues
from core.settings import QUEUES, Settings


class DeviceError(ValueError):
    """The worker was told to run jobs on more devices than it has."""


def available_devices(kind: str) -> int:
    """The devices of `kind` this process can use: CUDA devices it sees, or CPU cores."""
    if kind == "cuda":
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def device_kind(settings: Settings) -> str:
    """cuda for a worker of the gpu queue, else cpu."""
    return "cuda" if "gpu" in settings.queues else "cpu"


def worker_devices(settings: Settings) -> int:
    """The devices this worker runs one job on (see the module docstring); DeviceError when
    `worker_devices` asks for more than the machine has."""
    kind = device_kind(settings)
    have = available_devices(kind)
    if settings.worker_devices == 0:
        # all it has; a gpu worker that sees no CUDA device keeps the single-device behaviour of
        # before (the trainer falls back to its `device` rule), so a development box still works
        return max(1, have) if kind == "cuda" else 1
    if settings.worker_devices > have:
        raise DeviceError(
            f"worker_devices={settings.worker_devices}, but this worker has {have} {kind} device"
            f"{'s' if have != 1 else ''}: it would take jobs it cannot run"
        )
    return settings.worker_devices


def worker_queues(settings: Settings) -> tuple[int, list[str]]:
    """(devices, the broker queues to consume): every device count up to its own on its training
    queues; the inference queue as it is. A worker of both cpu and gpu counts its GPUs on the gpu
    queue only: its cpu queue stays single-device (`cpu`)."""
    if not any(q in QUEUES for q in settings.queues):
        return 1, settings.queues
    devices = worker_devices(settings)
    kind = device_kind(settings)
    queues: list[str] = []
    for queue in settings.queues:
        count = 1 if queue == "cpu" and kind == "cuda" else devices
        queues.extend(consumed_queues([queue], count))
    return devices, queues
