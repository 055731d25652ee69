"""Checkpoint and export files on a worker's disk (torch-free): a stored checkpoint tar back to its
folder, a folder into an uncompressed tar (a file, or a stream of its bytes)."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

from core.archives import extract_all

READ_SIZE = 8 << 20  # big reads: the thread streaming a checkpoint seldom takes the GIL


class CheckpointUnreadable(Exception):
    """The stored checkpoint tar holds no checkpoint folder."""


def extract_checkpoint_tar(tar_path: Path, dest: Path) -> Path:
    """Extract a checkpoint tar (folder at its root) into `dest`; returns the checkpoint folder.
    core.archives.extract_all refuses links out of `dest`, absolute paths and device files."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tf:
        extract_all(tf, dest)
    for config in sorted(dest.rglob("config.json")):
        if (config.parent / "model.safetensors").exists():
            return config.parent
    raise CheckpointUnreadable(
        "The stored checkpoint is not a checkpoint folder (no config.json + model.safetensors)."
    )


def tar_folder(folder: Path, out: Path, arcname: str, leave_out: frozenset[str] = frozenset()) -> Path:
    """An uncompressed tar of `folder`, named `arcname` at the tar's root, without the files at its
    top named in `leave_out`; written under a temporary name and renamed, so `out` is whole or absent."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.name.removeprefix(f"{arcname}/") in leave_out else info

    with tarfile.open(tmp, "w") as tf:
        tf.add(folder, arcname=arcname, filter=keep)
    os.replace(tmp, out)
    return out


def tar_stream(folder: Path, arcname: str, leave_out: frozenset[str] = frozenset()) -> Iterator[bytes]:
    """The bytes of an uncompressed tar of the flat folder `folder` (as `tar_folder` writes it),
    made as they are read: no tar file on disk, no copy of a file in memory beyond one read. The
    files must not change meanwhile (checkpoint files never do: a new save replaces the folder)."""
    top = tarfile.TarInfo(arcname)
    top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o755, int(folder.stat().st_mtime)
    yield top.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    written = tarfile.BLOCKSIZE
    for path in sorted(folder.iterdir()):
        if path.name in leave_out or not path.is_file():
            continue
        info = tarfile.TarInfo(f"{arcname}/{path.name}")
        stat = path.stat()
        info.size, info.mode, info.mtime = stat.st_size, 0o644, int(stat.st_mtime)
        header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield header
        with open(path, "rb") as f:
            yield from iter(lambda: f.read(READ_SIZE), b"")
        padding = -info.size % tarfile.BLOCKSIZE
        yield tarfile.NUL * padding
        written += len(header) + info.size + padding
    end = 2 * tarfile.BLOCKSIZE  # two zero blocks, then zeros to a whole record, as tarfile ends one
    yield tarfile.NUL * (end + (-(written + end) % tarfile.RECORDSIZE))
