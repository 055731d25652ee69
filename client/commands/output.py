"""Output shared by the client commands: rich consoles, JSON, tables, and the text of table cells.

A table goes to a terminal as a rich table fitted to its width; anywhere else (a pipe, a file) as
tab-separated lines of the full values, a header line first, so `cut -f`, `awk -F'\t'` and
spreadsheets read it and nothing is cut to 80 columns. `--json` prints the API's JSON instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


def make_console(stderr: bool = False) -> Console:
    """A rich Console on stdout (tables) or stderr (progress and notes), without highlighting."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def transfer_bar() -> Progress:
    """A progress bar of bytes sent or received (uploads, downloads), on stderr."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=make_console(stderr=True),
    )


def print_json(obj: Any) -> None:
    """The API's JSON, indented, on stdout (`--json`)."""
    print(json.dumps(obj, indent=2, sort_keys=False))


def print_deleted(answer: dict[str, Any], as_json: bool) -> None:
    """A DELETE's answer: its JSON (`--json`), else "deleted ID"."""
    if as_json:
        print_json(answer)
    else:
        print(f"deleted {answer.get('id', '?')}")


def format_time(ts: object, short: bool = False) -> str:
    """A Unix timestamp as local time ("-" when absent)."""
    if not isinstance(ts, int | float) or ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def _tab_separated(lines: Sequence[Sequence[object]], stream: TextIO) -> None:
    """Full values, one line each, tabs between; a tab or line break inside a value becomes a space."""
    for line in lines:
        stream.write("\t".join(" ".join(str(v).split()) if v is not None else "-" for v in line) + "\n")
    stream.flush()


def print_rows(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, stream: TextIO | None = None
) -> None:
    """A list (jobs, files, models): its first column the id, which is never cut on a terminal."""
    stream = stream or sys.stdout
    if not stream.isatty():
        _tab_separated([headers, *rows], stream)
        return
    from rich.table import Column, Table

    width = max([len(str(r[0])) for r in rows] + [2])
    table = Table(Column(headers[0], no_wrap=True, min_width=width), *headers[1:])
    for row in rows:
        table.add_row(*(str(v) for v in row))
    _console(stream).print(table)


def print_details(
    pairs: Sequence[tuple[str, object]], *, title: str | None = None, stream: TextIO | None = None
) -> None:
    """One thing's fields as `key value` lines (empty ones left out)."""
    stream = stream or sys.stdout
    shown = [(key, value) for key, value in pairs if value not in (None, "")]
    if not stream.isatty():
        _tab_separated(shown, stream)
        return
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in shown:
        table.add_row(key, str(value))
    _console(stream).print(table)


def _console(stream: TextIO) -> Console:
    from rich.console import Console

    return Console(file=stream, highlight=False)


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
