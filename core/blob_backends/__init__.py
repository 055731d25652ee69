"""Where a blob's bytes live. core/blobstore.py keeps the rows and the visibility protocol; a
backend here only moves bytes:

- `db` (db.py): chunks in the `blob_chunks` table, written through the store's sessions;
- `fs` (fs.py): one file per blob under a folder;
- `s3` (s3.py): one object per blob in an S3 bucket (SeaweedFS, MinIO, AWS...).

`fs` and `s3` keep their bytes outside the database: they share the `ExternalBackend` shape. The
store commits the `blobs` row (complete=False, `path` = the backend's location) *before* writing,
so a writer that dies leaves a row that `gc_incomplete` finds and whose leftovers it removes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO, Protocol

from core.blob_errors import BlobTooLarge

if TYPE_CHECKING:
    from core.blob_backends.s3 import S3Backend
    from core.settings import Settings


class ExternalBackend(Protocol):
    """Bytes kept outside the database, one location (a path, an object key) per blob."""

    name: str  # the `blobs.backend` value

    def location(self, blob_id: str) -> str:
        """Where the blob's bytes go (stored in `blobs.path`)."""
        ...

    def write(self, location: str, chunks: Iterable[bytes]) -> None:
        """Store all of `chunks` at `location`; nothing appears there unless the write completes.
        On an error, what was written so far is removed before raising."""
        ...

    def read(self, location: str, size: int, start: int = 0) -> Iterator[bytes]:
        """The bytes at `location` from byte `start` on (`size` is what the row recorded), lazily,
        in pieces. BlobCorrupt when they are missing."""
        ...

    def remove(self, location: str) -> None:
        """Remove the bytes at `location`; nothing there is fine."""
        ...

    def remove_partial(self, location: str) -> None:
        """Remove what a write to `location` that never finished may have left (temp files,
        unfinished multipart uploads)."""
        ...


def recut(stream: Iterable[bytes] | BinaryIO, size: int) -> Iterator[bytes]:
    """Re-cut any byte source into pieces of exactly `size` bytes (the last may be shorter)."""
    source: Iterable[bytes]
    if hasattr(stream, "read"):
        reader = stream  # file-like: read() returns b"" at EOF
        source = iter(lambda: reader.read(size), b"")
    else:
        source = stream
    buf = bytearray()
    for piece in source:
        if not piece:
            continue
        if not buf and len(piece) == size:  # already the size wanted: no copy
            yield bytes(piece)
            continue
        buf += piece
        while len(buf) >= size:
            with memoryview(buf) as view:
                cut = bytes(view[:size])  # one copy (a slice of the bytearray would be another)
            del buf[:size]
            yield cut
    if buf:
        yield bytes(buf)


class Meter:
    """Counts and hashes the bytes that pass through `measure`, and stops them past a limit."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._sha = hashlib.sha256()

    def measure(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.size += len(chunk)
            if self.max_bytes is not None and self.size > self.max_bytes:
                raise BlobTooLarge(self.max_bytes)
            self._sha.update(chunk)
            yield chunk

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


def new_blobs_bucket(settings: Settings) -> S3Backend | None:
    """With the s3 blob backend, the bucket new blobs go to (to check or create it), else None."""
    if settings.blob_backend != "s3":
        return None
    from core.blob_backends.s3 import S3Backend

    return S3Backend(settings.s3_bucket, endpoint_url=settings.s3_endpoint_url or None)
