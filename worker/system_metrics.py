"""Where the system metrics are measured (the registry's `system` phase, trainer.config.metrics):
the training process's CPU use and resident memory, and on CUDA the device's utilization and the
memory this process holds on it. Sampled once per metrics flush (worker.callbacks), so the cost is
one read of /proc and, on CUDA, one NVML query per flush, never per step.

CPU % is this process's CPU time (user + system, all its threads) over the wall time since the
previous sample: 400 means four cores busy. RSS is read from /proc/self/statm (Linux); elsewhere the
peak RSS from getrusage stands in. On CUDA, utilization comes from NVML (torch.cuda.utilization,
which needs the nvidia-ml-py package; None without it), memory from the caching allocator's reserve.
A job run by several processes (torch.distributed) is sampled in the worker's process, which relays
rank 0's callbacks: there these describe the worker, not the trainers.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from trainer.config.metrics import SystemMetrics, values

_STATM = Path("/proc/self/statm")


def _rss_bytes() -> float | None:
    try:
        return float(int(_STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
        return float(peak if sys.platform == "darwin" else peak * 1024)


def _cuda() -> Any | None:
    """torch.cuda when this process has initialised CUDA (a CPU job never starts it here)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


class SystemSampler:
    """One process's system metrics, each sample measured since the previous one."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), self._cpu_seconds())

    @staticmethod
    def _cpu_seconds() -> float:
        t = os.times()
        return t.user + t.system

    def sample(self, step: int) -> SystemMetrics:
        now, cpu = time.monotonic(), self._cpu_seconds()
        wall = now - self._last[0]
        percent = 100.0 * (cpu - self._last[1]) / wall if wall > 0 else None
        self._last = (now, cpu)
        utilization = memory = None
        cuda = _cuda()
        if cuda is not None:
            memory = float(cuda.memory_reserved())
            try:
                utilization = float(cuda.utilization())
            except Exception:  # no NVML bindings, or NVML refuses: the other metrics still count
                utilization = None
        return SystemMetrics(
            step=step, cpu_percent=percent, rss_bytes=_rss_bytes(), gpu_utilization=utilization,
            gpu_memory_bytes=memory,
        )  # fmt: skip

    def add_to(self, rows: dict[int, dict[str, float | None]]) -> None:
        """Put a sample on the newest buffered row (nothing when no row is buffered)."""
        if rows:
            step = max(rows)
            rows[step].update(values(self.sample(step)))
