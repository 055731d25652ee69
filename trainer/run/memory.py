"""Where the `peak_memory_bytes` metric is measured: the most memory the training process has held
so far, read between steps without a device sync and without resetting anything (a benchmark may
hold its own peak). On CUDA the bytes of tensors allocated on the run's device since the process
started (or since someone last reset CUDA's peak); on the CPU the process's peak resident set size,
which the OS keeps since the process started. So a worker that ran a larger job earlier in the
same process reports that job's peak: the value is the process's, not the run's alone."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_bytes(device: torch.device) -> float | None:
    """The process's peak memory on `device` so far; None where no peak is kept (MPS)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    if device.type == "cpu":
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(peak if sys.platform == "darwin" else peak * 1024)  # macOS counts bytes, Linux KiB
    return None
