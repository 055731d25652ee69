"""A full disk is a 507 `insufficient_storage` with `x-should-retry: false`, and nothing is left
behind (issue 25, finding 6; it was a 500 `internal_error`, which the SDK retries). The disk is
really full: a tmpfs of a few MiB mounted (as root) where the upload's temporary file, or the fs
blob store, writes; the kernel answers ENOSPC at the real write."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.models import File
from tests.api.conftest import Tenant, blob_count, count, upload
from tests.api.test_errors import assert_envelope

SIZE_MIB = 2


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """tiny_disk(name) -> a directory on a tmpfs of SIZE_MIB MiB (unmounted at teardown)."""
    mounted: list[Path] = []

    def mount(name: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"a full disk needs a tmpfs mount (root): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _full(response: Any) -> dict[str, Any]:
    err = assert_envelope(response, 507)
    assert err["code"] == "insufficient_storage" and err["type"] == "server_error"
    assert response.headers["x-should-retry"] == "false"
    return err


def _nothing_kept(session_factory: Any, tenant: Tenant, blobs_before: int, *dirs: Path) -> None:
    assert count(session_factory, File, File.owner_id == tenant.owner_id) == 0
    assert blob_count(session_factory) == blobs_before
    for d in dirs:
        assert not d.exists() or [p for p in d.rglob("*") if p.is_file()] == [], list(d.rglob("*"))


def test_a_full_upload_dir_is_507_and_leaves_nothing(
    settings: Any, tenant: Tenant, session_factory: Any, tiny_disk: Callable[[str], Path]
) -> None:
    from api.main import create_app

    work = tiny_disk("work")  # the upload's temporary file goes to work/uploads
    full = settings.model_copy(update={"work_dir": work})
    blobs = blob_count(session_factory)
    with TestClient(create_app(full)) as c:
        _full(upload(c, tenant, b"a line of text\n" * (SIZE_MIB * 100_000), "big.txt"))
        _nothing_kept(session_factory, tenant, blobs, work)
        # space left for a small one: the disk full was the reason, nothing else
        assert upload(c, tenant, b"small enough\n", "small.txt").status_code == 200


def test_a_full_blob_store_is_507_and_leaves_nothing(
    settings: Any, tenant: Tenant, session_factory: Any, tiny_disk: Callable[[str], Path]
) -> None:
    from api.main import create_app

    blob_dir = tiny_disk("blobs")  # the fs backend writes the blob here; the upload spools elsewhere
    full = settings.model_copy(update={"blob_backend": "fs", "blob_dir": blob_dir})
    blobs = blob_count(session_factory)
    with TestClient(create_app(full)) as c:
        err = _full(upload(c, tenant, b"a line of text\n" * (SIZE_MIB * 100_000), "big.txt"))
        assert "no storage space left" in err["message"]
        _nothing_kept(session_factory, tenant, blobs, blob_dir, Path(full.work_path) / "uploads")
