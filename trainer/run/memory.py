"""Where the `peak_memory_bytes` metric is measured: the most memory the run has held so far, read
between steps without a device sync. `reset_peak_memory` starts the count when the run starts, so a
training worker (one process for job after job) reports each job's own peak, not the largest job's
it ever ran: on CUDA the bytes of tensors allocated on the run's device (torch's peak statistics), on
Linux the process's peak resident set size (VmHWM, reset through /proc/self/clear_refs). Elsewhere
the CPU figure is the process's peak since it started (getrusage), which cannot be reset."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_PEAK_RSS = "5"  # proc(5): reset the peak resident set size to the current one


def reset_peak_memory(device: torch.device) -> None:
    """Count the peak from now on (where the platform allows it)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "cpu" and _CLEAR_REFS.exists():
        try:
            _CLEAR_REFS.write_text(_RESET_PEAK_RSS)
        except OSError:
            pass  # not permitted here: the process's peak since it started stands


def peak_memory_bytes(device: torch.device) -> float | None:
    """The run's peak memory on `device` so far; None where no peak is kept (MPS)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    if device.type != "cpu":
        return None
    peak_kib = _status_kib("VmHWM")
    if peak_kib is not None:
        return float(peak_kib * 1024)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)  # macOS counts bytes, Linux KiB


def _status_kib(field: str) -> int | None:
    """A `field:  N kB` line of /proc/self/status (Linux), or None."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class PeakMemory:
    """The run's peak so far, which never falls. Linux keeps its high-water mark lazily: VmHWM is
    max(the recorded mark, the RSS now), and the mark is brought up to date only on some unmaps, so
    after the RSS drops VmHWM can read lower than a moment before (seen: 4 KiB). The highest
    reading is what the run has held."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.highest: float | None = None
        reset_peak_memory(device)

    def read(self) -> float | None:
        now = peak_memory_bytes(self.device)
        if now is not None and (self.highest is None or now > self.highest):
            self.highest = now
        return self.highest
