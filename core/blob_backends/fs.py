"""The `fs` backend: one file per blob at `<root>/<xx>/<blob id>`, written to a temp file beside
it, fsynced and renamed into place, so a reader never sees half a file."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path

from core.blob_errors import BlobCorrupt


class FsBackend:
    name = "fs"

    def __init__(self, root: Path | str, chunk_size: int) -> None:
        self.root = Path(root)
        self.chunk_size = chunk_size

    def location(self, blob_id: str) -> str:
        # fan out on the random part of the id (the "blob-" prefix is the same for all)
        return f"{blob_id.rsplit('-', 1)[-1][:2]}/{blob_id}"

    def write(self, location: str, chunks: Iterable[bytes]) -> None:
        final = self.root / location
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, location: str, size: int, start: int = 0) -> Iterator[bytes]:
        path = self.root / location
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise BlobCorrupt(f"blob file {path} is missing") from None
        with f:
            f.seek(start)
            yield from iter(lambda: f.read(self.chunk_size), b"")

    def remove(self, location: str) -> None:
        (self.root / location).unlink(missing_ok=True)

    def remove_partial(self, location: str) -> None:
        final = self.root / location
        if final.parent.exists():
            for tmp in final.parent.glob(f"{final.name}.tmp-*"):
                tmp.unlink(missing_ok=True)
