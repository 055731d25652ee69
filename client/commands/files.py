"""`fromscratch files upload|list|delete`: training files on the server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from client.commands.output import (
    format_size,
    format_time,
    print_deleted,
    print_json,
    print_rows,
    transfer_bar,
)
from client.commands.runner import EXIT_OK, UsageError, connect


def cmd_files_upload(args: argparse.Namespace) -> int:
    """`files upload FILE`: stream the file up with a progress bar; print its id."""
    path = Path(args.file)
    if path.is_dir():
        raise UsageError(f"{path} is a folder: upload its files one at a time")
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    size = path.stat().st_size
    with connect(args) as client, transfer_bar() as bar:
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
    with connect(args) as client:
        page = client.list_files()
    if args.json:
        print_json(page)
        return EXIT_OK
    rows = [
        [
            f.get("id", "?"),
            f.get("filename", "-"),
            format_size(f.get("bytes")),
            f.get("purpose", "-"),
            format_time(f.get("created_at")),
        ]
        for f in page.get("data", [])
    ]
    print_rows(["ID", "Filename", "Size", "Purpose", "Created"], rows)
    return EXIT_OK


def cmd_files_delete(args: argparse.Namespace) -> int:
    """`files delete FILE_ID`: delete an uploaded file (jobs that trained on it keep their record)."""
    with connect(args) as client:
        print_deleted(client.delete_file(args.id), args.json)
    return EXIT_OK
