"""Checkpoint and export files on a worker's disk (torch-free): a stored checkpoint tar back to its
folder, a folder into an uncompressed tar."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path


class CheckpointUnreadable(Exception):
    """The stored checkpoint tar holds no checkpoint folder."""


def extract_checkpoint_tar(tar_path: Path, dest: Path) -> Path:
    """Extract a checkpoint tar (folder at its root) into `dest`; returns the checkpoint folder.
    The `data` filter refuses links out of `dest`, absolute paths and device files."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tf:
        tf.extractall(dest, filter="data")
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
