"""Output shared by the client commands: rich consoles, JSON, and the text of table cells."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def make_console(stderr: bool = False) -> Console:
    """A rich Console on stdout (tables) or stderr (progress and notes), without highlighting."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def print_json(obj: Any) -> None:
    """The API's JSON, indented, on stdout (`--json`)."""
    print(json.dumps(obj, indent=2, sort_keys=False))


def format_time(ts: object, short: bool = False) -> str:
    """A Unix timestamp as local time ("-" when absent)."""
    if not isinstance(ts, int | float) or ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def add_id_column(table: Table, rows: list[dict[str, Any]]) -> None:
    """A first ID column that is never cut or wrapped: ids are what users copy."""
    from rich.table import Column

    width = max([len(str(r.get("id", ""))) for r in rows] + [2])
    table.columns.insert(0, Column("ID", no_wrap=True, min_width=width))


def format_number(value: object, fmt: str = ".4f") -> str:
    """A number in `fmt` ("-" when absent)."""
    return format(value, fmt) if isinstance(value, int | float) else "-"


def format_duration(seconds: object) -> str:
    """Seconds as 1h02m03s, 2m03s or 3s ("-" when absent)."""
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def format_size(n: object) -> str:
    """A byte count in decimal units ("-" when absent)."""
    if not isinstance(n, int | float):
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def format_progress(job: dict[str, Any]) -> str:
    """A job's step as "step/total" (or "step", or "-")."""
    p = job.get("progress") or {}
    step, total = p.get("step"), p.get("total_steps")
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)
