"""`fromscratch models list|show|delete|download`: trained models on the server (and the base
models it lists); `models complete` is client/commands/complete.py."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from client.commands.output import (
    format_size,
    format_time,
    print_deleted,
    print_json,
    print_rows,
    transfer_bar,
)
from client.commands.runner import EXIT_OK, CommandError, connect
from core.archives import extract_all
from core.exports import DOWNLOADS
from trainer.config.export_formats import ExportFormatSpec

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

DEFAULT_WAIT = 600.0  # seconds `models download` waits for a worker to prepare an export


def cmd_models_list(args: argparse.Namespace) -> int:
    """`models list`: your models as a table."""
    with connect(args) as client:
        page = client.list_models()
    if args.json:
        print_json(page)
        return EXIT_OK
    rows = [
        [m.get("id", "?"), m.get("kind", "-"), format_time(m.get("created")), m.get("owned_by", "-")]
        for m in page.get("data", [])
    ]
    print_rows(["ID", "Kind", "Created", "Owned by"], rows)
    return EXIT_OK


def cmd_models_show(args: argparse.Namespace) -> int:
    """`models show MODEL_ID`: one model's fields, a line each."""
    with connect(args) as client:
        model = client.get_model(args.id)
    if args.json:
        print_json(model)
        return EXIT_OK
    fields = ("id", "kind", "job_id", "step", "root", "parent", "max_model_len", "formats", "owned_by")
    rows = [[name, _shown(model.get(name))] for name in fields]
    print_rows(["Field", "Value"], [*rows, ["created", format_time(model.get("created"))]])
    return EXIT_OK


def _shown(value: object) -> str:
    if value is None:
        return "-"
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def cmd_models_delete(args: argparse.Namespace) -> int:
    """`models delete MODEL_ID`: delete a model or checkpoint (its exports, and its weights once its job has ended)."""
    with connect(args) as client:
        print_deleted(client.delete_model(args.id), args.json)
    return EXIT_OK


def cmd_models_download(args: argparse.Namespace) -> int:
    """`models download MODEL_ID`: stream the export to a file (whole or not at all). An export the
    server has not made yet is prepared by a worker first: the command waits for it (`--wait`). A
    folder format (hf, checkpoint) arrives as one tar and is unpacked into its folder (`--tar`
    keeps the tar)."""
    unpack = _download(args.format).is_folder and not args.tar
    part = _PartFile(_tar_folder(args.output) if unpack else args.output)
    with connect(args) as client, transfer_bar() as bar:
        label = f"{args.id} ({args.format}{'' if args.dtype == 'f32' else ' ' + args.dtype})"
        # the bar shows once the server has answered: not before an error (a 404 printed an empty one)
        task = _LazyTask(bar, label)
        waited: float | None = None

        def on_preparing(seconds: float) -> None:
            """A worker is making the export (the server answered 202): show the wait."""
            nonlocal waited
            if waited is None and not bar.console.is_terminal:  # no live display: one line instead
                bar.console.print(f"preparing {args.format}… (a worker is making the export)")
            waited = seconds
            bar.update(task.id, description=f"preparing {args.format}… {seconds:.0f}s")

        def on_start(total: int | None, filename: str | None) -> None:
            if waited is not None:
                bar.update(task.id, description=label)
                bar.console.print(f"{args.format} export prepared after {waited:.0f}s")
            part.open(filename or f"{args.id.replace(':', '_')}.{_download(args.format).extension}")
            bar.update(task.id, total=total)

        try:
            client.download_model(
                args.id,
                args.format,
                write=part.write,
                on_start=on_start,
                progress=lambda n: bar.advance(task.id, n),
                dtype=args.dtype,
                wait=args.wait,
                on_preparing=on_preparing,
            )
            final = part.finish()
        finally:
            part.discard()
    size = final.stat().st_size
    if unpack:
        final = unpack_folder(final, args.output)
    print(f"saved {final} ({format_size(size)})", file=sys.stderr)
    print(final)
    return EXIT_OK


class _LazyTask:
    """A progress bar's task, added when first used."""

    def __init__(self, bar: Progress, label: str) -> None:
        self.bar, self.label = bar, label
        self._id: TaskID | None = None

    @property
    def id(self) -> TaskID:
        if self._id is None:
            self._id = self.bar.add_task(self.label, total=None)
        return self._id


def unpack_folder(tar_path: Path, output: str | None) -> Path:
    """The folder a folder format's tar holds, where the download asked for it: `--output` when it
    names no existing folder, else the tar's own folder name inside it (or here). Unpacked beside
    it first and moved in once whole; the tar is removed after. A destination that exists and is
    not empty is left alone: the tar is kept and the error says where it is."""
    unpacking = tar_path.with_name(f".{tar_path.name}.unpack-{os.getpid()}")
    try:
        try:
            with tarfile.open(tar_path) as tar:
                extract_all(tar, unpacking)
        except tarfile.TarError as e:  # core.archives' refusals too
            raise CommandError(f"the download is not a folder's tar ({e}); it is in {tar_path}") from e
        entries = list(unpacking.iterdir())
        one_folder = len(entries) == 1 and entries[0].is_dir()
        root = entries[0] if one_folder else unpacking
        if output is not None and not Path(output).is_dir():
            dest = Path(output)
        else:
            dest = (Path(output) if output is not None else Path()) / (
                root.name if one_folder else tar_path.stem
            )
        try:
            os.replace(root, dest)  # a folder moves onto a missing or empty one only
        except OSError as e:
            raise CommandError(f"{dest}: {e.strerror}; the download is in {tar_path}") from e
    finally:
        shutil.rmtree(unpacking, ignore_errors=True)
    tar_path.unlink()
    return dest


def _tar_folder(output: str | None) -> str | None:
    """Where a tar to unpack is downloaded: the folder its folder will be in."""
    if output is None or Path(output).is_dir():
        return output
    parent = Path(output).parent
    parent.mkdir(parents=True, exist_ok=True)
    return str(parent)


class _PartFile:
    """Where a download goes: `--output` (a file, or a folder for the server's file name) or the
    server's file name here. Written as `.<name>.part-<pid>` beside it and renamed once whole, so
    the file appears whole or not at all."""

    def __init__(self, output: str | None):
        self.output = Path(output) if output else None
        self.final: Path | None = None
        self.tmp: Path | None = None
        self.fh: BinaryIO | None = None

    def open(self, default_name: str) -> None:
        if self.output is None:
            final = Path(default_name)
        elif self.output.is_dir():
            final = self.output / default_name
        else:
            final = self.output
        final.parent.mkdir(parents=True, exist_ok=True)
        self.final, self.tmp = final, final.with_name(f".{final.name}.part-{os.getpid()}")
        self.fh = self.tmp.open("wb")

    def write(self, chunk: bytes) -> None:
        assert self.fh is not None  # opened when the download started, before the first chunk
        self.fh.write(chunk)

    def finish(self) -> Path:
        assert self.tmp is not None and self.final is not None and self.fh is not None  # opened first
        self.fh.close()
        os.replace(self.tmp, self.final)
        return self.final

    def discard(self) -> None:
        """Close and remove what a download that did not finish left (nothing after `finish`)."""
        if self.fh is not None and not self.fh.closed:
            self.fh.close()
        if self.tmp is not None and self.tmp.exists():
            self.tmp.unlink()


def _download(fmt: str) -> ExportFormatSpec:
    """A download format's spec: its extension (when the server names no file), whether a folder."""
    return next(d for d in DOWNLOADS if d.name == fmt)
