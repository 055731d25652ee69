"""`fromscratch files upload|list`: training files on the server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from client.commands.output import add_id_column, format_size, format_time, make_console, print_json
from client.commands.runner import EXIT_OK, UsageError, connect


def cmd_files_upload(args: argparse.Namespace) -> int:
    """`files upload FILE`: stream the file up with a progress bar; print its id."""

    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    size = path.stat().st_size
    with (
        connect(args) as client,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=make_console(stderr=True),
            transient=False,
        ) as bar,
    ):
        task = bar.add_task(f"uploading {path.name}", total=size)
        obj = client.upload_file(path, purpose=args.purpose, progress=lambda n: bar.advance(task, n))
    if args.json:
        print_json(obj)
    else:
        print(f"uploaded {path.name} ({format_size(obj.get('bytes', size))}) as {obj['id']}", file=sys.stderr)
        print(obj["id"])
    return EXIT_OK


def cmd_files_list(args: argparse.Namespace) -> int:
    """`files list`: your uploaded files as a table."""

    from rich.table import Table

    with connect(args) as client:
        page = client.list_files()
    if args.json:
        print_json(page)
        return EXIT_OK
    files = page.get("data", [])
    table = Table("Filename", "Size", "Purpose", "Created")
    add_id_column(table, files)
    for f in files:
        table.add_row(
            f.get("id", "?"),
            f.get("filename", "-"),
            format_size(f.get("bytes")),
            f.get("purpose", "-"),
            format_time(f.get("created_at")),
        )
    make_console().print(table)
    return EXIT_OK
