"""The rows bench/gpu_check.py gathers into its one table: a step's script prints each figure it
measured as one line `GPU_CHECK_ROW {json}` beside its own output, and gpu_check.py collects the
lines of every step (so no step needs to know the others, and a step run alone prints the same)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

MARKER = "GPU_CHECK_ROW "


@dataclass(frozen=True)
class Row:
    step: str  # the gpu_check step that measured it
    item: str  # what was measured, e.g. "llama-110m bf16 compiled tokens/s"
    value: float | str  # the figure (a number, or a word such as a device's name)
    unit: str = ""
    goal: str = ""  # the goal it is checked against, in words ("" when none)
    met: bool | None = None  # whether the goal is met (None: no goal, or not decidable here)


def emit(row: Row) -> None:
    """Prints the row in the form gpu_check.py collects (NaN, which JSON lacks, as null)."""
    value = None if isinstance(row.value, float) and math.isnan(row.value) else row.value
    print(MARKER + json.dumps({**asdict(row), "value": value}), flush=True)


def parse_rows(lines: Iterable[str]) -> list[Row]:
    """The rows among a step's output lines; lines that only look like rows are skipped."""
    rows = []
    for line in lines:
        if not line.startswith(MARKER):
            continue
        try:
            fields = json.loads(line[len(MARKER) :])
            value = fields["value"]
            rows.append(
                Row(
                    step=str(fields["step"]),
                    item=str(fields["item"]),
                    value=math.nan if value is None else value,
                    unit=str(fields.get("unit", "")),
                    goal=str(fields.get("goal", "")),
                    met=fields.get("met"),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return rows


def format_value(value: float | str) -> str:
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def table_lines(rows: list[Row]) -> list[str]:
    """The rows as one aligned text table: step, item, value, unit, goal, verdict."""
    head = ("step", "item", "value", "unit", "goal", "met")
    cells = [head] + [
        (
            r.step,
            r.item,
            format_value(r.value),
            r.unit,
            r.goal,
            "-" if r.met is None else ("yes" if r.met else "NO"),
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]
