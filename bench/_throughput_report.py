"""bench/trainer_throughput.py's results: the per-variant Row, the printed table, and the rows
bench/gpu_check.py gathers (tokens/s, FLOP rate, MFU against the measured matmul peak and against
the GPU's datasheet, and peak memory against the trainer's estimate, trainer.config.estimate)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import platform
import re
import statistics
from datetime import UTC, datetime
from pathlib import Path

import torch

from bench._gpu_rows import Row as CheckRow
from bench._gpu_rows import emit
from bench._timed_training import PeakMeter, Variant, clock_name, variant_config
from trainer.config.estimate import estimate_memory

# Dense (not sparse) bf16 tensor-core peaks from the vendors' datasheets, FLOP/s, by a name's words.
# The most specific names first: "H100 PCIe" before "H100".
DATASHEET_BF16: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)
# the goals: how close the trainer's peak memory must be to its estimate
MEMORY_GOAL = 0.25


def datasheet_bf16(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a GPU by its name (None: not in the table)."""
    for words, flops in DATASHEET_BF16:
        if words in device_name:
            return flops
    return None


@dataclasses.dataclass
class Row:
    variant: Variant
    flops_per_token: int
    n_params: int
    tps: list[float] = dataclasses.field(default_factory=list)
    mfu_fp32: list[float] = dataclasses.field(default_factory=list)
    mfu_bf16: list[float] = dataclasses.field(default_factory=list)
    x_nano: list[float] = dataclasses.field(default_factory=list)
    mem: list[float] = dataclasses.field(default_factory=list)
    left_out: str | None = None  # why a run's figures are not the variant's (a graphed run ran eager)


def machine_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1).strip() if m else cpu
    flags = []
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text()
        flags = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if re.search(rf"\b{f}\b", info)]
    return (
        f"{cpu}, {os.cpu_count()} cores ({'/'.join(flags) or 'no avx512'}), {torch.get_num_threads()} "
        f"torch threads, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    )


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_table(rows: list[Row], meter: PeakMeter, device: torch.device) -> None:
    print()
    print(
        f"# trainer_throughput  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine_description(device)}; "
        f"{clock_name()}"
    )
    peak_desc = ", ".join(f"{p} {median(v) / 1e9:,.0f} (n={meter.size[p]})" for p, v in meter.history.items())
    print(
        f"# matmul peak GFLOP/s, median: {peak_desc}. tok/s and MFU: medians over all timed steps of "
        "all rounds, each step divided by the peak measured beside it"
    )
    head = (
        "config",
        "dtype",
        "compile",
        "kernels",
        "params",
        "tok/step",
        "tok/s",
        "MFU/fp32pk",
        "MFU/bf16pk",
        "x nanoGPT",
        "peak MiB",
    )
    table = [head]
    for r in rows:
        name, prec, comp, kern = r.variant.label
        table.append(
            (
                name,
                prec,
                comp,
                kern if not r.variant.compile and (prec == "fp32" or device.type == "cuda") else "-",
                f"{r.n_params / 1e6:.2f}M",
                str(r.variant.tokens_per_step),
                fmt(median(r.tps), ",.0f"),
                fmt(median(r.mfu_fp32) * 100, ".1f") + "%",
                fmt(median(r.mfu_bf16) * 100, ".1f") + "%",
                fmt(median(r.x_nano) if r.x_nano else None, ".2f"),
                fmt(max(r.mem) if r.mem else None, ",.0f"),
            )
        )
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    for i, t in enumerate(table):
        print(
            "  ".join(
                c.rjust(w) if j >= 4 else c.ljust(w) for j, (c, w) in enumerate(zip(t, widths, strict=True))
            )
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))


def emit_rows(rows: list[Row], device: torch.device) -> None:
    """A GPU_CHECK_ROW per figure of each variant (bench/gpu_check.py's table)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sheet = datasheet_bf16(name) if device.type == "cuda" else None
    for r in rows:
        v = r.variant
        mode = f"{'compiled' if v.compile else 'eager'}{' graphed' if v.graphs else ''}"
        label = f"{v.name} {v.precision} {mode}{'' if v.kernels else ' torch-ops'}"
        label += " reads-at-once" if v.reads_at_once else ""
        if not r.tps:  # not one round ran as the variant says (its reason printed with the run)
            emit(CheckRow("throughput", f"{label}: left out", r.left_out or "not run"))
            continue
        tps = median(r.tps)
        emit(CheckRow("throughput", f"{label} tokens/s", tps, "tokens/s"))
        emit(CheckRow("throughput", f"{label} TFLOP/s", tps * r.flops_per_token / 1e12, "TFLOP/s"))
        emit(
            CheckRow(
                "throughput",
                f"{label} MFU of measured {v.precision} matmul peak",
                100 * median(r.mfu_bf16 if v.precision == "bf16" else r.mfu_fp32),
                "%",
            )
        )
        if sheet is not None and v.precision == "bf16":
            mfu = 100 * tps * r.flops_per_token / sheet
            goal = ">= 55%" if v.name == "llama-1.2b" and v.compile else ""
            emit(
                CheckRow(
                    "throughput",
                    f"{label} MFU of datasheet bf16 {sheet / 1e12:.0f} TFLOP/s",
                    mfu,
                    "%",
                    goal,
                    (mfu >= 55) if goal else None,
                )
            )
        if r.mem and not v.compile:
            # the measured peak leaves out the process's runtime (CPU: RSS before the run; CUDA: the
            # context, outside max_memory_allocated), so the estimate's runtime share is too
            est = estimate_memory(v.model, variant_config(v, device), device.type)  # type: ignore[arg-type]
            estimate = (est.training_peak - est.runtime) / 2**20
            apart = abs(max(r.mem) - estimate) / max(r.mem)
            emit(
                CheckRow(
                    "throughput",
                    f"{label} peak memory / estimate (MiB)",
                    f"{max(r.mem):,.0f} / {estimate:,.0f}",
                    "MiB",
                    f"<= {MEMORY_GOAL:.0%} apart",
                    apart <= MEMORY_GOAL,
                )
            )
