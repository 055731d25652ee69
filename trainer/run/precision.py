"""What `dtype: auto` and `compile: auto` (unset) become on this machine, and why.

The machines runs land on differ: bf16 matmuls run natively (and faster than fp32) on CPUs with
AVX512-BF16 or AMX, but are emulated elsewhere (measured 90x slower than fp32 on an AVX2-only CPU),
and torch.compile pays back its compile time only over a long enough run. So:

- dtype auto: bfloat16 on a CUDA device that supports it; on a CPU, bfloat16 only where the CPU
  has native bf16 *and* a short matmul probe (a few ms) measures it faster than float32; float32
  otherwise. float16 is never chosen (it needs a loss scaler); ask for it.
- compile auto, one process: from measurement (`MeasuredCompile`). The run starts eager, times its
  first steps, and then compiles its transformer blocks (regional compilation: one block's code,
  compiled once, serves every layer, at half a whole-model compile's cost) when the time that saves
  over the steps left pays back the compile time PAYBACK times. The compile time and speedup are
  those measured before on this machine (trainer.run.compile_memory: a worker remembers them per
  device kind and model shape), else REGIONAL_COMPILE's. A time_limit caps the steps left. After
  compiling it times the compiled steps and remembers what compiling cost and gained; compiled
  steps slower than the eager ones send the run back to eager (KEEP_COMPILED_FROM).
- compile auto, several processes: the whole model when the run's estimated length (its FLOPs at
  the probe's matmul rate, at a conservative share of it) exceeds COMPILE_PAYBACK times the compile
  time expected (COMPILE_SECONDS). `--compile` / `--no-compile` decide instead.

Each choice comes with its reason, printed at the start of a run and stored in its checkpoints.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.config import TrainConfig
from trainer.run.compile_memory import CompileFigures, CompileMemory, default_figures

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_MIN_SPEEDUP = 1.1  # the probe must show bf16 at least this much faster than fp32
COMPILE_SECONDS = {"cpu": 100.0, "cuda": 40.0}
COMPILE_PAYBACK = 20.0  # compile when the run is estimated at more than this many compile times
MATMUL_SHARE = 0.5  # the share of the probe's matmul rate a training step is assumed to reach
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


MEASURE_STEPS = 3  # eager steps timed (after the first, a warm-up) before compile auto decides
PAYBACK = 1.2  # compile when it saves at least this many times what it costs
KEEP_COMPILED_FROM = 1.0  # compiled blocks stay only when their steps run at least this much faster


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


@functools.cache
def matmul_rate(device_type: str, dtype: torch.dtype) -> float:
    """FLOP/s of a square matmul on this device in `dtype`, measured once per process (~10 ms on a
    CPU with native support; seconds where bf16 is emulated, which is why the flags come first)."""
    n = 256 if device_type == "cpu" else 2048
    device = torch.device(device_type)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    reps = 3 if device_type == "cpu" else 10
    a @ b  # warm-up (kernel selection, allocations)
    if device_type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device_type == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * reps / max(time.perf_counter() - t0, 1e-9)


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
    speedup = matmul_rate("cpu", torch.bfloat16) / matmul_rate("cpu", torch.float32)
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
        f"auto: the run is estimated at {_duration(estimate)}, {relation} {COMPILE_PAYBACK:.0f}x "
        f"torch.compile's ~{compile_s:.0f} s",
    )


def compile_from_measurement(
    device_type: str, eager_step_s: float, steps_left: int, figures: CompileFigures | None = None
) -> Choice:
    """Whether compiling the blocks now pays back over `steps_left` steps of `eager_step_s` each,
    by `figures` (REGIONAL_COMPILE's for the device kind when not given)."""
    figures = figures or default_figures(device_type)
    if figures is None:
        return Choice("off", f"auto: no compile on {device_type}")
    saves = steps_left * eager_step_s * (1 - 1 / figures.speedup)
    enough = saves > PAYBACK * figures.cost_s
    return Choice(
        "on" if enough else "off",
        f"auto: eager steps take {eager_step_s * 1000:,.0f} ms; compiling the blocks (~{figures.cost_s:.0f} s, "
        f"{figures.speedup:.2f}x, {figures.source}) would save ~{_duration(saves)} over the "
        f"{steps_left:,} steps left, {'over' if enough else 'under'} {PAYBACK:g}x its cost",
    )


class MeasuredCompile:
    """compile auto's timing: `observe()` at the start of every step. Once MEASURE_STEPS steps after
    the first are timed it returns the decision (then None). When it compiled, it goes on timing:
    the first compiled step (the compile) and MEASURE_STEPS more, then `measured` says what
    compiling cost and gained, `memory` (when given) remembers it for this shape, and where the
    compiled steps were the slower ones it returns a second decision, "off"."""

    def __init__(
        self,
        device_type: str,
        time_limit: float | None,
        clock: Callable[[], float] = time.perf_counter,
        memory: CompileMemory | None = None,
        shape: str = "",
    ):
        self.device_type, self.time_limit, self.clock = device_type, time_limit, clock
        self.memory, self.shape = memory, shape
        self.marks: list[float] = []
        self.started = clock()
        self.eager_s = 0.0
        self.compiled = False
        self.measured: str | None = None  # the sentence, once the compiled steps are timed

    @property
    def done(self) -> bool:
        decided = len(self.marks) >= MEASURE_STEPS + 2
        return decided and (not self.compiled or self.measured is not None)

    def observe(self, steps_left: int) -> Choice | None:
        self.marks.append(self.clock())
        if len(self.marks) == 2 * MEASURE_STEPS + 3 and self.compiled:
            return self._measure_compiled(steps_left)
        if len(self.marks) != MEASURE_STEPS + 2:  # the first mark ends the warm-up step
            return None
        self.eager_s = eager = (self.marks[-1] - self.marks[1]) / MEASURE_STEPS
        if self.time_limit is not None:  # the steps a time limit leaves time for
            left_s = max(0.0, self.time_limit - (self.marks[-1] - self.started))
            steps_left = min(steps_left, int(left_s / max(eager, 1e-9)))
        figures = self.memory.figures(self.device_type, self.shape) if self.memory else None
        choice = compile_from_measurement(self.device_type, eager, steps_left, figures)
        self.compiled = choice.value == "on"
        return choice

    def _measure_compiled(self, steps_left: int) -> Choice | None:
        """Times the compiled steps (and remembers them). Compiled steps slower than the eager ones
        (inductor's code can lose to the eager path's hand-fused kernels: on a 2-core CPU, llama-15m
        ran 1.36x longer compiled than eager over 15 minutes) give the decision back: eager
        again, the compile's cost lost but no more."""
        decided = MEASURE_STEPS + 1  # the mark where compiling began
        compiled_s = (self.marks[-1] - self.marks[decided + 1]) / MEASURE_STEPS
        cost = max(0.0, self.marks[decided + 1] - self.marks[decided] - compiled_s)
        speedup = self.eager_s / max(compiled_s, 1e-9)
        if self.memory is not None:
            self.memory.remember(self.device_type, self.shape, cost, speedup)
        self.measured = (
            f"torch.compile measured: compiling took {cost:.1f} s; compiled steps {compiled_s * 1000:,.0f} ms "
            f"vs {self.eager_s * 1000:,.0f} ms eager ({speedup:.2f}x)"
            + (" (remembered for the next run of this shape)" if self.memory is not None else "")
        )
        if speedup >= KEEP_COMPILED_FROM:
            return None
        return Choice(
            "off",
            f"auto: the compiled steps ran slower than the eager ones: eager again for the {steps_left:,} "
            "steps left",
        )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
