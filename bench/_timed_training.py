"""One timed training run for bench/trainer_throughput.py: real steps of `trainer.run.loop.train`,
each timed and given the fp32 and bf16 matmul peaks measured right beside it (`PeakMeter`), and the
run's peak memory.

`clock` times steps and peaks alike: wall clock by default; `use_thread_clock()` switches to the
CPU time of the one training thread (torch at 1 thread), which does not count time the OS gave to
other processes and so keeps ratios steady on a shared machine (bench/README.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from trainer.config import ModelConfig, TrainConfig
from trainer.config.metrics import StepMetrics
from trainer.data.prepare import TokenData
from trainer.data.tokenizers import ByteTokenizer
from trainer.model import cpu_kernels, triton_kernels
from trainer.run import step_read
from trainer.run.loop import train
from trainer.run.report import Callbacks
from trainer.run.state import StartInfo

Precision = Literal["fp32", "bf16"]
DTYPE_NAME: dict[str, Literal["float32", "bfloat16"]] = {"fp32": "float32", "bf16": "bfloat16"}
TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}
# "wall" (perf_counter) is what a user sees; "thread" is steady on a busy machine (see above)
clock: Callable[[], float] = time.perf_counter


def use_thread_clock() -> None:
    global clock
    clock = time.thread_time


def clock_name() -> str:
    return "thread CPU time" if clock is time.thread_time else "wall clock"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str  # configuration label
    model: ModelConfig
    batch_size: int
    precision: Precision
    compile: bool = False
    # the fused kernels where a run can use them: C on the CPU (trainer.model.cpu_kernels), Triton on
    # CUDA (trainer.model.triton_kernels); False: torch ops
    kernels: bool = True
    graphs: bool = False  # TrainConfig.cuda_graphs: the blocks replayed as CUDA graphs
    # each step's loss read at once (FROMSCRATCH_DEFERRED_READS=0), CUDA's way before it read them
    # one step late (trainer/run/step_read.py): the A/B of that change
    reads_at_once: bool = False

    @property
    def label(self) -> tuple[str, str, str, str]:
        kernels = "graphed" if self.graphs else "fused" if self.kernels else "torch"
        return (
            self.name,
            self.precision,
            "on" if self.compile else "off",
            kernels + (" (read at once)" if self.reads_at_once else ""),
        )

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.ctx


# ---------------------------------------------------------------- memory
_LIBC: Any = None


def _status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def reset_rss_peak() -> int | None:
    """Give freed heap back to the OS, reset the kernel's peak-RSS mark (VmHWM) to the current RSS,
    and return that RSS in KiB (None where /proc is unavailable)."""
    global _LIBC
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        _LIBC = _LIBC or ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_kib("VmRSS")


# ---------------------------------------------------------------- matmul peak
class PeakMeter:
    """Square-matmul FLOP/s in fp32 and bf16, at the size that does best here (chosen once among a
    few sizes like the model's matmuls), measured in short bursts between training steps."""

    def __init__(self, device: torch.device, sizes: tuple[int, ...], seconds: float):
        self.device, self.seconds = device, seconds
        self.history: dict[str, list[float]] = {"fp32": [], "bf16": []}
        self.size: dict[str, int] = {}
        self._mats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for prec in ("fp32", "bf16"):
            trials: dict[int, list[float]] = {n: [] for n in sizes}
            for _ in range(3):  # interleaved, so a burst of load elsewhere hits every size alike
                for n in sizes:
                    trials[n].append(self._flops(self._make(prec, n), seconds))
            self.size[prec] = max(sizes, key=lambda n: statistics.median(trials[n]))
            self._mats[prec] = self._make(prec, self.size[prec])

    def _make(self, prec: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = TORCH_DTYPE[prec]
        return (
            torch.randn(n, n, device=self.device).to(dtype),
            torch.randn(n, n, device=self.device).to(dtype),
        )

    def _flops(self, mats: tuple[torch.Tensor, torch.Tensor], seconds: float) -> float:
        a, b = mats
        n = a.shape[0]
        cuda = self.device.type == "cuda"
        a @ b  # warm (kernel selection, caches)
        if cuda:
            torch.cuda.synchronize()
        iters, batch, t0 = 0, 1, clock()
        while True:
            for _ in range(batch):
                a @ b
            if cuda:
                torch.cuda.synchronize()
            iters += batch
            elapsed = clock() - t0
            if elapsed >= seconds:
                return 2 * n**3 * iters / elapsed
            if cuda:
                batch = min(batch * 2, 64)

    def __call__(self) -> dict[str, float]:
        out = {}
        for prec, mats in self._mats.items():
            out[prec] = self._flops(mats, self.seconds)
            self.history[prec].append(out[prec])
        return out


# ---------------------------------------------------------------- one timed training run
class EnoughSteps(Exception):
    """Raised by StepTimer once it has timed enough steps: the run ends there, without the step
    checkpoint a stopped run writes (a 1.2B model's weights and AdamW state are ~14 GB to write,
    for nothing, in every timed run)."""


class StepTimer(Callbacks):
    """Times each step (from the end of the previous on_step to this one: the loop's own per-step
    work included) and measures the fp32 and bf16 matmul peaks between steps, so every step has a
    peak measured beside it (the mean of the nearest measurements before and after it). It ends the
    run by raising EnoughSteps, which run_training catches.

    On the CPU the peaks are measured after every timed step. On CUDA only where the timed steps
    start and after the last: a step is reported there once the next is queued (trainer.run.
    step_read), and a measurement between steps (which waits for the GPU) would break that
    overlap and time the step after it as the host's queueing alone."""

    def __init__(
        self,
        warmup: int,
        min_steps: int,
        seconds: float,
        device: torch.device,
        peak: Callable[[], dict[str, float]] | None = None,
    ):
        self.warmup, self.min_steps, self.seconds, self.device = warmup, min_steps, seconds, device
        self.peak = peak
        self.durations: list[float] = []
        self.peaks: list[dict[str, float]] = []  # peaks[i] measured after step i ({}: none)
        self.losses: list[float] = []
        self.peak_kib: int | None = None
        self.notes: list[str] = []
        self._start: float | None = None

    def on_start(self, info: StartInfo) -> None:
        self._start = clock()

    def on_note(self, message: str) -> None:
        """The run's decisions (compile auto's, whether CUDA graphs captured) beside its figures."""
        self.notes.append(message)
        print(f"    note: {message}", flush=True)

    def on_step(self, metrics: StepMetrics) -> None:
        now = clock()  # after the step's loss is read: the step is done on the device
        assert self._start is not None
        self.durations.append(now - self._start)
        self.losses.append(metrics.train_loss)
        enough = self._enough()
        if enough:  # the training steps' peak memory, read before the matmul peak's buffers exist
            self._read_peak_memory()
        self.peaks.append(self.peak() if self._measures_peak_now(enough) else {})
        if enough:
            raise EnoughSteps
        self._start = clock()

    def timed(self) -> list[tuple[float, dict[str, float]]]:
        """(duration, peak beside it) of each step after the warmup."""
        out = []
        for i in range(self.warmup, len(self.durations)):
            before = next((p for p in reversed(self.peaks[:i]) if p), {})
            after = next((p for p in self.peaks[i:] if p), {})
            peak = {k: (before[k] + after[k]) / 2 for k in before} if before and after else {}
            out.append((self.durations[i], peak))
        return out

    def _measures_peak_now(self, enough: bool) -> bool:
        if self.peak is None or len(self.durations) < self.warmup:
            return False
        return self.device.type != "cuda" or enough or len(self.durations) == self.warmup

    def _enough(self) -> bool:
        timed = self.durations[self.warmup :]
        return len(timed) >= self.min_steps and sum(timed) >= self.seconds

    def _read_peak_memory(self) -> None:
        if self.device.type == "cuda":
            self.peak_kib = torch.cuda.max_memory_allocated(self.device) // 1024
        else:
            self.peak_kib = _status_kib("VmHWM")


@dataclasses.dataclass
class RunResult:
    steps: list[tuple[float, dict[str, float]]]  # (seconds, {"fp32": FLOP/s, "bf16": FLOP/s})
    mem_mib: float | None
    losses: list[float]
    notes: list[str] = dataclasses.field(default_factory=list)  # the run's decisions, as printed


def variant_config(v: Variant, device: torch.device) -> TrainConfig:
    """The training settings every timed run of a variant uses (and its memory estimate reads)."""
    return TrainConfig(
        max_steps=10**6,
        batch_size=v.batch_size,
        learning_rate=1e-3,
        warmup_steps=10,
        eval_every=0,
        checkpoint_every=0,
        keep_checkpoints=1,
        device=device.type,  # type: ignore[arg-type]
        dtype=DTYPE_NAME[v.precision],
        compile=v.compile,
        cuda_graphs=v.graphs,
        log_every=1,
        # the architecture's step, as nanoGPT's bench.py times its own (dropout 0): auto would pick
        # 0.2 for llama-110m on 8M tokens (trainer.config.data_aware) and time the dropout too
        dropout=0.0,
    )


class BytesInAWiderVocabulary(ByteTokenizer):
    """Byte tokens for a model whose vocabulary is wider than the bytes' 258 (nanoGPT's 50304):
    train() sizes the model's embedding and output projection by its tokenizer, so the byte
    tokenizer itself would turn such a config back into a 258-token model."""

    def __init__(self, vocab_size: int):
        if vocab_size < ByteTokenizer.vocab_size:
            raise ValueError(f"a vocabulary of {vocab_size} cannot hold the 258 byte ids")
        self.vocab_size = vocab_size

    def __repr__(self) -> str:
        return f"BytesInAWiderVocabulary({self.vocab_size})"


def bench_tokenizer(model: ModelConfig) -> ByteTokenizer:
    """The byte tokenizer, at the model's vocabulary size."""
    if model.vocab_size == ByteTokenizer.vocab_size:
        return ByteTokenizer()
    return BytesInAWiderVocabulary(model.vocab_size)


def train_until_enough(model: ModelConfig, cfg: TrainConfig, data: TokenData, callbacks: Callbacks) -> None:
    """`train` in a scratch folder (removed after) until the callbacks raise EnoughSteps; the
    data's ids are bytes, the model keeps its own vocabulary."""
    out = Path(tempfile.mkdtemp(prefix="fs-bench-"))
    try:
        with contextlib.suppress(EnoughSteps):
            train(model, cfg, data, out, callbacks, tokenizer=bench_tokenizer(model))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_training(
    v: Variant,
    data: TokenData,
    device: torch.device,
    warmup: int,
    min_steps: int,
    seconds: float,
    threads: int | None,
    peak: Callable[[], dict[str, float]],
) -> RunResult:
    cfg = variant_config(v, device)
    timer = StepTimer(max(1, warmup), min_steps, seconds, device, peak)
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base_kib: int | None = 0
        else:
            base_kib = reset_rss_peak()
        if threads:
            torch.set_num_threads(threads)
        for switch in (cpu_kernels.DISABLE_ENV, triton_kernels.DISABLE_ENV):
            os.environ[switch] = "1" if v.kernels else "0"
        if v.reads_at_once:
            os.environ[step_read.ENV] = "0"
        else:  # the device's default
            os.environ.pop(step_read.ENV, None)
        cpu_kernels._load.cache_clear()  # both read the switch anew
        triton_kernels.available.cache_clear()
        train_until_enough(v.model, cfg, data, timer)
    finally:
        if v.compile:
            torch._dynamo.reset()
    mem = None
    if timer.peak_kib is not None and base_kib is not None:
        mem = (timer.peak_kib - base_kib) / 1024
    return RunResult(timer.timed(), mem, timer.losses, timer.notes)
