"""bench/gpu_check.py's summary: the figures read off steps that print no GPU_CHECK_ROW lines of
their own (pytest's summary, `fromscratch train`'s checkpoint line), the ratios to nanoGPT, and the
JSON file."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench._gpu_rows import Row, parse_rows

_PYTEST = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|tests? collected)")
_CHECKPOINTS = re.compile(
    r"(\d+) checkpoints \(([\d,]+) MB of tensors\) written in the background in ([\d.]+) s; "
    r"training waited ([\d.]+) s"
)
# (ours, nanoGPT's, goal): the FLOP rates the issue compares
NANOGPT_GOALS: tuple[tuple[str, str, float | None], ...] = (
    ("llama-110m bf16 eager TFLOP/s", "nanoGPT 124M bf16 eager TFLOP/s", 1.0),
    ("llama-110m bf16 compiled TFLOP/s", "nanoGPT 124M bf16 compiled TFLOP/s", 1.1),
    # eager with cuda_graphs on (off by default until a GPU has measured it): beside, no goal
    ("llama-110m bf16 eager graphed TFLOP/s", "nanoGPT 124M bf16 eager TFLOP/s", None),
    # each step's loss read at once (the A/B of reading it a step late, trainer/run/step_read.py)
    ("llama-110m bf16 eager reads-at-once TFLOP/s", "nanoGPT 124M bf16 eager TFLOP/s", None),
    # at nanoGPT's vocabulary (trainer_throughput's -v50k config): no goal of the issue's, shown beside
    ("llama-110m-v50k bf16 eager TFLOP/s", "nanoGPT 124M bf16 eager TFLOP/s", None),
    ("llama-110m-v50k bf16 compiled TFLOP/s", "nanoGPT 124M bf16 compiled TFLOP/s", None),
)


def step_rows(step: str, lines: list[str]) -> list[Row]:
    """A step's rows: those it printed, and those read off its known output lines."""
    rows = parse_rows(lines)
    text = "\n".join(lines)
    if step == "tests":
        counts = {word.rstrip("s"): int(n) for n, word in _PYTEST.findall(text)}
        summary = ", ".join(f"{n} {w}" for w, n in counts.items()) or "no summary"
        rows.append(
            Row(
                step,
                "pytest -m cuda",
                summary,
                goal="none failed",
                met=not counts.get("failed") and not counts.get("error") and bool(counts),
            )
        )
    if step == "checkpoints" and (m := _CHECKPOINTS.search(text)):
        n, mb, write, waited = m.groups()
        rows.append(Row(step, f"{n} checkpoints ({mb} MB) written in the background", float(write), "s"))
        rows.append(Row(step, "training waited for them", float(waited), "s"))
    return rows


def nanogpt_ratios(rows: list[Row]) -> list[Row]:
    """Our FLOP rate over nanoGPT's, for each pair the run measured both sides of."""
    values = {r.item: r.value for r in rows if isinstance(r.value, float | int)}
    out = []
    for ours, theirs, goal in NANOGPT_GOALS:
        if ours in values and theirs in values and values[theirs]:
            ratio = float(values[ours]) / float(values[theirs])
            label = ours.replace(" TFLOP/s", "").replace("llama-110m bf16 ", "")
            out.append(
                Row(
                    "summary",
                    f"{label} FLOP rate x nanoGPT's",
                    ratio,
                    "x",
                    "" if goal is None else f">= {goal}",
                    None if goal is None else not math.isnan(ratio) and ratio >= goal,
                )
            )
    return out


def write_json(
    path: Path, machine: dict[str, Any], steps: dict[str, dict[str, Any]], rows: list[Row]
) -> None:
    """The table as JSON (a NaN figure as null, which JSON has)."""
    table = [
        {**asdict(r), "value": None if isinstance(r.value, float) and math.isnan(r.value) else r.value}
        for r in rows
    ]
    path.write_text(json.dumps({"machine": machine, "steps": steps, "rows": table}, indent=2) + "\n")
