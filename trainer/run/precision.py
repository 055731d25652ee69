"""What `dtype: auto` and `compile: auto` (unset) become on this machine, and why.

The machines runs land on differ: bf16 matmuls run natively (and faster than fp32) on CPUs with
AVX512-BF16 or AMX, but are emulated elsewhere (measured 90x slower than fp32 on an AVX2-only CPU),
and torch.compile pays back its compile time only over a long enough run. So:

- dtype auto: bfloat16 on a CUDA device that supports it; on a CPU, bfloat16 only where the CPU
  has native bf16 *and* a short matmul probe on one thread (~20 ms) measures it faster than float32; float32
  otherwise. float16 is never chosen (it needs a loss scaler); ask for it.
- compile auto, one process: from measurement (trainer.run.measured_compile). The run starts eager,
  times its first steps, compiles its transformer blocks when that pays back over the steps left,
  and keeps them only when a trial of compiled against eager steps finds them faster.
- compile auto, several processes: the whole model when the run's estimated length (its FLOPs at
  the probe's matmul rate, at a conservative share of it) exceeds COMPILE_PAYBACK times the compile
  time expected (COMPILE_SECONDS). `--compile` / `--no-compile` decide instead.

Each choice comes with its reason, printed at the start of a run and stored in its checkpoints.
"""

from __future__ import annotations

import functools
import re
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.config import TrainConfig

if TYPE_CHECKING:
    from trainer.checkpoint import Checkpoint

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_MIN_SPEEDUP = 1.1  # the probe must show bf16 at least this much faster than fp32
COMPILE_SECONDS = {"cpu": 100.0, "cuda": 40.0}
COMPILE_PAYBACK = 20.0  # compile when the run is estimated at more than this many compile times
MATMUL_SHARE = 0.5  # the share of the probe's matmul rate a training step is assumed to reach
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Choice:
    """A decision and the sentence that explains it."""

    value: str  # dtype name ("float32", "bfloat16"...) or "on"/"off" for compile
    reason: str


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    with suppress(OSError):
        m = re.search(r"^flags\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if m:
            return set(m.group(1).split())
    return set()


PROBE_ROUNDS = 7  # timed rounds of the matmul probe; the fastest counts


@functools.cache
def matmul_rate(device_type: str, dtype: torch.dtype, one_thread: bool = False) -> float:
    """FLOP/s of a square matmul on this device in `dtype`, measured once per process: the fastest
    of PROBE_ROUNDS rounds, since another process's load only ever slows a round. `one_thread`:
    on one CPU thread, the rate to compare dtypes by: on a CPU busy with another job, a matmul
    on all threads waits on the slowest and reads anything (bf16 at 0.49x and at 96x fp32 on one
    2-core machine whose one thread reads 2.5x-4.5x). ~20 ms on a CPU with native support;
    seconds where bf16 is emulated, which is why the flags come first."""
    if one_thread and device_type == "cpu" and torch.get_num_threads() > 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return matmul_rate(device_type, dtype, one_thread)
        finally:
            torch.set_num_threads(threads)
    n = 256 if device_type == "cpu" else 2048
    device = torch.device(device_type)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    reps = 3 if device_type == "cpu" else 10
    a @ b  # warm-up (kernel selection, allocations)
    fastest = float("inf")
    for _ in range(PROBE_ROUNDS):
        if device_type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        if device_type == "cuda":
            torch.cuda.synchronize()
        fastest = min(fastest, time.perf_counter() - t0)
    return 2 * n**3 * reps / max(fastest, 1e-9)


def choose_dtype(cfg: TrainConfig, device: torch.device) -> Choice:
    if cfg.dtype != "auto":
        return Choice(cfg.dtype, "asked for")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Choice("bfloat16", "auto: the CUDA device supports bfloat16")
        return Choice("float32", "auto: the CUDA device has no bfloat16")
    if device.type != "cpu":
        return Choice("float32", f"auto: float32 on {device.type}")
    native = [f for f in NATIVE_BF16_FLAGS if f in cpu_flags()]
    if not native:
        return Choice(
            "float32", "auto: this CPU has no native bfloat16 (no AVX512-BF16 or AMX), it would be emulated"
        )
    speedup = matmul_rate("cpu", torch.bfloat16, one_thread=True) / matmul_rate(
        "cpu", torch.float32, one_thread=True
    )
    if speedup >= BF16_MIN_SPEEDUP:
        return Choice(
            "bfloat16",
            f"auto: native bfloat16 ({'/'.join(native)}), {speedup:.1f}x float32 in a matmul probe",
        )
    return Choice(
        "float32",
        f"auto: native bfloat16 ({'/'.join(native)}) but only {speedup:.2f}x float32 in a matmul probe",
    )


def choose_compile(
    cfg: TrainConfig, device: torch.device, dtype: str, flops_per_step: float, steps: int
) -> Choice:
    if cfg.compile is not None:
        return Choice("on" if cfg.compile else "off", "asked for")
    compile_s = COMPILE_SECONDS.get(device.type)
    if compile_s is None:
        return Choice("off", f"auto: no compile on {device.type}")
    rate = matmul_rate(device.type, DTYPES[dtype] if dtype != "float16" else torch.float16) * MATMUL_SHARE
    estimate = steps * flops_per_step / rate
    if cfg.time_limit is not None:
        estimate = min(estimate, cfg.time_limit)
    enough = estimate > COMPILE_PAYBACK * compile_s
    relation = "over" if enough else "under"
    return Choice(
        "on" if enough else "off",
        f"auto: the run is estimated at {duration(estimate)}, {relation} {COMPILE_PAYBACK:.0f}x "
        f"torch.compile's ~{compile_s:.0f} s",
    )


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


RESUMED_DTYPE = "auto: as the run this resumes "


def resumed_dtype(cfg: TrainConfig, resumed: Checkpoint | None, device: torch.device) -> Choice | None:
    """dtype auto on a resumed run: what auto chose for the run it continues (on the same kind of
    device), so a run never changes precision half-way because a timing probe came out otherwise."""
    saved = resumed.state.get("precision", {}) if resumed is not None else {}
    if cfg.dtype != "auto" or saved.get("dtype") not in DTYPES or saved.get("device") != device.type:
        return None
    reason = str(saved.get("dtype_reason", ""))
    if not reason.startswith(RESUMED_DTYPE):  # a run resumed again keeps the first reason, not nested
        reason = f"{RESUMED_DTYPE}({reason})"
    return Choice(saved["dtype"], reason)
