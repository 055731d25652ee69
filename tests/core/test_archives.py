"""core.archives.extract_all: plain files and folders come out, absolute paths inside the
destination; members climbing out of it and links out are refused, with Python's data filter (3.11.4+) and without it
(Python 3.11.0-3.11.3, simulated by hiding the filter), and nothing lands outside."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from core.archives import extract_all


@pytest.fixture(params=["data filter", "without it"])
def python_without_filter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "without it":
        monkeypatch.delattr(tarfile, "data_filter")
        return True
    assert hasattr(tarfile, "data_filter"), "this Python has the data filter"
    return False


def archive(*members: tuple[str, Callable[[tarfile.TarInfo], None]]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, shape in members:
            info = tarfile.TarInfo(name)
            shape(info)
            data = b"weights" if info.isfile() else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf)


def plain(info: tarfile.TarInfo) -> None:
    info.mode = 0o4777  # set-uid and world-writable: both cleared


def folder(info: tarfile.TarInfo) -> None:
    info.type, info.mode = tarfile.DIRTYPE, 0o755


def link_to(target: str) -> Callable[[tarfile.TarInfo], None]:
    def shape(info: tarfile.TarInfo) -> None:
        info.type, info.linkname = tarfile.SYMTYPE, target

    return shape


def test_files_and_folders_come_out(python_without_filter: bool, tmp_path: Path) -> None:
    with archive(("ckpt", folder), ("ckpt/model.safetensors", plain)) as tar:
        extract_all(tar, tmp_path / "out")
    written = tmp_path / "out" / "ckpt" / "model.safetensors"
    assert written.read_bytes() == b"weights"
    assert written.stat().st_mode & 0o7777 == 0o755


def test_an_absolute_path_lands_inside(python_without_filter: bool, tmp_path: Path) -> None:
    with archive(("/abs/model.safetensors", plain)) as tar:
        extract_all(tar, tmp_path / "out")
    assert (tmp_path / "out" / "abs" / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize(
    "member",
    [("../evil", plain), ("ckpt/../../evil", plain), ("escape", link_to("/etc/passwd"))],
    ids=["parent", "climbing", "link out"],
)
def test_unsafe_members_are_refused(
    python_without_filter: bool, member: tuple[str, Callable[[tarfile.TarInfo], None]], tmp_path: Path
) -> None:
    dest = tmp_path / "deep" / "out"
    with archive(member) as tar, pytest.raises(tarfile.TarError):
        extract_all(tar, dest)
    assert not (tmp_path / "deep" / "evil").exists() and not (tmp_path / "evil").exists()
    assert not (dest / "escape").exists()
