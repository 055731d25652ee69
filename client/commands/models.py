"""`fromscratch models list|download`: trained models on the server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import BinaryIO

from client.commands.output import add_id_column, format_size, format_time, make_console, print_json
from client.commands.runner import EXIT_OK, connect

FORMATS = ("gguf", "hf", "onnx", "checkpoint")
DTYPES = ("f32", "f16", "q8_0")
DEFAULT_WAIT = 600.0  # seconds `models download` waits for a worker to prepare an export


def cmd_models_list(args: argparse.Namespace) -> int:
    """`models list`: your models as a table."""

    from rich.table import Table

    with connect(args) as client:
        page = client.list_models()
    if args.json:
        print_json(page)
        return EXIT_OK
    models = page.get("data", [])
    table = Table("Created", "Owned by")
    add_id_column(table, models)
    for m in models:
        table.add_row(m.get("id", "?"), format_time(m.get("created")), m.get("owned_by", "-"))
    make_console().print(table)
    return EXIT_OK


def cmd_models_download(args: argparse.Namespace) -> int:
    """`models download MODEL_ID`: stream the export to a file (whole or not at all). An export the
    server has not made yet is prepared by a worker first: the command waits for it (`--wait`)."""

    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    out_arg = Path(args.output) if args.output else None
    tmp: Path | None = None
    fh: BinaryIO | None = None
    final: Path | None = None
    with (
        connect(args) as client,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=make_console(stderr=True),
        ) as bar,
    ):
        label = f"{args.id} ({args.format}{'' if args.dtype == 'f32' else ' ' + args.dtype})"
        task = bar.add_task(label, total=None)
        waited: float | None = None

        def on_preparing(seconds: float) -> None:
            """A worker is making the export (the server answered 202): show the wait."""
            nonlocal waited
            if waited is None and not bar.console.is_terminal:  # no live display: one line instead
                bar.console.print(f"preparing {args.format}… (a worker is making the export)")
            waited = seconds
            bar.update(task, description=f"preparing {args.format}… {seconds:.0f}s")

        def on_start(total: int | None, filename: str | None) -> None:
            nonlocal tmp, fh, final
            if waited is not None:
                bar.update(task, description=label)
                bar.console.print(f"{args.format} export prepared after {waited:.0f}s")
            default_name = filename or f"{args.id.replace(':', '_')}.{_default_ext(args.format)}"
            if out_arg is None:
                final = Path(default_name)
            elif out_arg.is_dir():
                final = out_arg / default_name
            else:
                final = out_arg
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.part-{os.getpid()}")
            fh = tmp.open("wb")
            bar.update(task, total=total)

        def write(chunk: bytes) -> None:
            assert fh is not None  # opened by on_start, before the first chunk
            fh.write(chunk)

        try:
            client.download_model(
                args.id,
                args.format,
                write=write,
                on_start=on_start,
                progress=lambda n: bar.advance(task, n),
                dtype=args.dtype,
                wait=args.wait,
                on_preparing=on_preparing,
            )
            assert tmp is not None and final is not None and fh is not None  # on_start ran first
            fh.close()
            os.replace(tmp, final)  # the file appears whole or not at all
        finally:
            if fh is not None and not fh.closed:
                fh.close()
            if tmp is not None and tmp.exists():
                tmp.unlink()
    size = final.stat().st_size
    print(f"saved {final} ({format_size(size)})", file=sys.stderr)
    print(final)
    return EXIT_OK


def _default_ext(fmt: str) -> str:
    """The file extension of a download format when the server names no file."""
    return {"gguf": "gguf", "onnx": "onnx", "hf": "tar", "checkpoint": "tar"}[fmt]
