"""Unpacking a tar archive (a checkpoint, a TensorBoard log) safely on every Python the project runs
on. Python's "data" extraction filter makes absolute paths relative, refuses members that land
outside the destination, links out of it and device files, and drops set-uid bits and ownership.
It came in 3.11.4 (and 3.12); Python 3.11.0 to 3.11.3 (Debian 12 ships 3.11.2) lack it, so there
the same rules are applied here before extracting, more strictly: only plain files and folders pass.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path


class UnsafeArchive(tarfile.TarError):
    """A member a safe extraction refuses (on Pythons without the data filter; with it, the
    filter's own errors, tarfile.FilterError, which are TarErrors too)."""


def extract_all(tar: tarfile.TarFile, dest: str | os.PathLike[str]) -> None:
    """Every member of `tar` into `dest`, under the data filter's rules (module docstring)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = Path(dest).resolve()
    members = tar.getmembers()
    for member in members:
        _check_member(member, root)
    tar.extractall(dest, members=members)


def _check_member(member: tarfile.TarInfo, root: Path) -> None:
    """Refuses what the data filter would (and links of any kind); clears what it clears."""
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchive(f"{member.name!r} is not a plain file or folder")
    member.name = member.name.lstrip("/" + os.sep)  # as the filter and tar do: inside the destination
    if not (root / member.name).resolve().is_relative_to(root):
        raise UnsafeArchive(f"{member.name!r} would land outside the destination")
    member.mode &= 0o755  # no set-uid/set-gid bits, nothing writable by others
    # not the archive's owners: root would chown the files to them
    member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
