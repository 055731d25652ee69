"""Blob store: bytes for uploads, tokenized data, checkpoints and exports.

One class over three backends (core/blob_backends/), chosen by `backend` for new blobs:
- "db": chunks of `chunk_size` bytes in `blob_chunks`, so a worker on another machine needs only
  the database URL. Streamed both ways, never the whole blob in memory.
- "fs": one file at `<blob_dir>/<xx>/<blob id>`, written to a temp file and renamed into place
  (the embedded `fromscratch serve`'s default: no model bytes in SQLite).
- "s3": one object per blob in an S3 bucket (SeaweedFS, MinIO, AWS), written as a multipart
  upload and read with ranged GETs.

Visibility protocol ("write, then commit the row that points to it"):
1. `put()` inserts the `blobs` row with complete=False and the bytes, committing in its *own*
   short transactions (so a 1 GiB upload never holds one giant transaction or, on SQLite, the
   write lock for the whole upload); for "fs" and "s3" the row (with its path or key) is
   committed *before* the bytes are written, so a writer that dies leaves a row to find;
2. at the end it sets size, sha256 and complete=True on the row in the *caller's* session and
   flushes; the caller commits that together with the row that points at the blob (File,
   Checkpoint, Export). If the caller rolls back or the process dies, the blob stays incomplete:
   never readable, and removed by `gc_incomplete()` with whatever bytes it left (a temp file,
   an object, an unfinished multipart upload).
Exception: on SQLite, when the caller's session already holds the (single) write lock, put()
writes through the caller's transaction instead (its own would wait for that lock forever).
A write that fails removes its bytes and its row at once; should removing the bytes fail (the S3
server unreachable), the row stays, incomplete, so `gc_incomplete()` tries again later.

Reads dispatch on the row's `backend`, so blobs written before a backend switch stay readable
(an "s3" row needs the bucket configured, an "fs" row the blob_dir). Every read checks size and
sha256 at the end and raises BlobCorrupt on a mismatch. Deleting removes the rows in the caller's
transaction and the bytes outside the database only once it commits.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from sqlalchemy import delete, event, select
from sqlalchemy.orm import Session, sessionmaker

from core.blob_backends import ExternalBackend, Meter, recut
from core.blob_backends.db import read_chunks, write_chunks
from core.blob_backends.fs import FsBackend
from core.blob_errors import BlobCorrupt, BlobError, BlobNotFound, BlobTooLarge
from core.models import Blob, BlobChunk, new_id, utcnow

if TYPE_CHECKING:
    from core.blob_backends.s3 import S3Backend
    from core.settings import Settings

__all__ = [
    "BACKENDS",
    "CHUNK_SIZE",
    "BlobCorrupt",
    "BlobError",
    "BlobNotFound",
    "BlobStore",
    "BlobTooLarge",
    "blobstore_from_settings",
    "is_store_outage",
]

CHUNK_SIZE = 1 << 20  # 1 MiB: small enough for any driver, few enough rows for big blobs
FS_PIECE = 8 << 20  # what an fs write is cut into
BACKENDS = ("db", "fs", "s3")
_REMOVALS_KEY = "fromscratch.blob_removals"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Removal:
    """Bytes outside the database to remove (and what an unfinished write left, if `partial`)."""

    backend: ExternalBackend
    location: str
    partial: bool = False

    def run(self) -> bool:
        """Remove them; False (logged) when the backend failed."""
        try:
            self.backend.remove(self.location)
            if self.partial:
                self.backend.remove_partial(self.location)
        except Exception as exc:
            log.warning("could not remove blob bytes at %s (%s): %s", self.location, self.backend.name, exc)
            return False
        return True


def _holds_sqlite_write_lock(session: Session) -> bool:
    if session.get_bind().dialect.name != "sqlite" or not session.in_transaction():
        return False
    # pysqlite opens its transaction at the first write: in_transaction means "holds the lock"
    return bool(getattr(session.connection().connection.dbapi_connection, "in_transaction", False))


# Bytes outside the database go only once the deleting transaction commits: a rollback keeps them.
@event.listens_for(Session, "after_commit")
def _remove_after_commit(session: Session) -> None:
    for removal in session.info.pop(_REMOVALS_KEY, ()):
        removal.run()


@event.listens_for(Session, "after_rollback")
def _forget_removals(session: Session) -> None:
    session.info.pop(_REMOVALS_KEY, None)


class BlobStore:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        backend: str = "db",
        blob_dir: Path | str | None = None,
        chunk_size: int = CHUNK_SIZE,
        s3: S3Backend | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown blob backend {backend!r}: use one of {', '.join(BACKENDS)}")
        if backend == "fs" and blob_dir is None:
            raise ValueError("the 'fs' blob backend needs blob_dir")
        if backend == "s3" and s3 is None:
            raise ValueError("the 's3' blob backend needs its bucket (FROMSCRATCH_S3_BUCKET)")
        self.session_factory = session_factory
        self.backend = backend
        self.blob_dir = Path(blob_dir) if blob_dir is not None else None
        self.chunk_size = chunk_size
        self.s3 = s3
        # the backends this store can read and remove (every one configured, not only `backend`)
        self._external: dict[str, ExternalBackend] = {}
        if self.blob_dir is not None:
            self._external["fs"] = FsBackend(self.blob_dir, chunk_size)
        if s3 is not None:
            self._external["s3"] = s3

    def _external_for(self, blob_id: str, backend: str) -> ExternalBackend:
        found = self._external.get(backend)
        if found is None:
            setting = "FROMSCRATCH_S3_BUCKET" if backend == "s3" else "FROMSCRATCH_BLOB_DIR"
            raise BlobError(f"blob {blob_id} is stored on the {backend!r} backend: set {setting}")
        return found

    # ---- writing ---------------------------------------------------------------------------
    def put(self, stream: Iterable[bytes] | BinaryIO, session: Session, max_bytes: int | None = None) -> Blob:
        """Store the bytes; return the Blob row (complete, flushed, not committed) in `session`.
        Raises BlobTooLarge (after removing everything written) past `max_bytes`."""
        shared = self._shared(session)
        written = self._write(stream, shared, max_bytes)
        return self._complete(session, *written)

    def put_file(self, path: Path | str, session: Session, max_bytes: int | None = None) -> Blob:
        with open(path, "rb") as f:
            return self.put(f, session, max_bytes=max_bytes)

    def put_many(self, sources: list[Path | Iterable[bytes]], session: Session) -> list[Blob]:
        """Several blobs (files, or byte streams), completed together in `session` (put() twice
        would, on SQLite, write the second one holding the write lock completing the first took)."""
        shared = self._shared(session)
        written: list[tuple[str, Meter]] = []
        try:
            for source in sources:
                if isinstance(source, Path):
                    with open(source, "rb") as f:
                        written.append(self._write(f, shared, None))
                else:
                    written.append(self._write(source, shared, None))
        except BaseException:
            for blob_id, _ in written:
                self._discard(blob_id, shared)
            raise
        return [self._complete(session, blob_id, meter) for blob_id, meter in written]

    @staticmethod
    def _shared(session: Session) -> Session | None:
        # On SQLite a caller that already wrote holds the one write lock: our own transactions
        # would wait for it forever, so write through the caller's transaction instead.
        return session if _holds_sqlite_write_lock(session) else None

    def _write(
        self, stream: Iterable[bytes] | BinaryIO, shared: Session | None, max_bytes: int | None
    ) -> tuple[str, Meter]:
        """The bytes of a new blob, its row left incomplete: (blob id, what was measured)."""
        blob_id = new_id("blob")
        meter = Meter(max_bytes)
        # big pieces for files: fewer trips through Python (and the GIL) per gigabyte (s3 cuts its
        # parts itself and keeps one in memory; db rows stay chunk_size)
        size = max(self.chunk_size, FS_PIECE) if self.backend == "fs" else self.chunk_size
        chunks = meter.measure(recut(stream, size))
        try:
            if self.backend == "db":
                self._write_db(blob_id, chunks, shared)
            else:
                self._write_external(self._external[self.backend], blob_id, chunks, shared)
        except BaseException:
            self._discard(blob_id, shared)
            raise
        return blob_id, meter

    @staticmethod
    def _complete(session: Session, blob_id: str, meter: Meter) -> Blob:
        blob = session.get(Blob, blob_id)
        if blob is None:  # a concurrent gc removed it: treat like a failed write
            raise BlobError(f"blob {blob_id} vanished while being written")
        blob.size, blob.sha256, blob.complete = meter.size, meter.sha256, True
        session.flush()
        return blob

    @contextmanager
    def _writer(self, shared: Session | None) -> Iterator[tuple[Session, bool]]:
        """(session, owned): our own short-transaction session, or the caller's."""
        if shared is not None:
            yield shared, False
            return
        with self.session_factory() as own:
            yield own, True

    def _write_db(self, blob_id: str, chunks: Iterable[bytes], shared: Session | None) -> None:
        with self._writer(shared) as (s, owned):
            s.add(Blob(id=blob_id, backend="db", complete=False))
            s.flush()
            write_chunks(s, blob_id, chunks, owned)
            if owned:
                s.commit()

    def _write_external(
        self, backend: ExternalBackend, blob_id: str, chunks: Iterable[bytes], shared: Session | None
    ) -> None:
        location = backend.location(blob_id)
        with self._writer(shared) as (s, owned):  # the row first, so a crash leaves something gc can find
            s.add(Blob(id=blob_id, backend=backend.name, path=location, complete=False))
            s.commit() if owned else s.flush()
        backend.write(location, chunks)

    def _discard(self, blob_id: str, shared: Session | None) -> None:
        """Remove a failed write: its bytes, then its rows (kept for gc if the bytes stay)."""
        external = self._external.get(self.backend)
        if external is not None and not _Removal(external, external.location(blob_id)).run():
            return  # the row stays incomplete: gc_incomplete removes both later
        with self._writer(shared) as (s, owned):
            if owned:
                self._delete_rows(s, blob_id)
                s.commit()
            else:
                try:
                    self._delete_rows(s, blob_id)
                except Exception:  # the caller's transaction is broken: its rollback removes the rows
                    pass

    # ---- reading ---------------------------------------------------------------------------
    def info(self, blob_id: str) -> Blob:
        """The complete Blob row (size, sha256) or BlobNotFound."""
        with self.session_factory() as s:
            blob = s.get(Blob, blob_id)
            if blob is None or not blob.complete:
                raise BlobNotFound(blob_id)
            s.expunge(blob)
            return blob

    def open(self, blob_id: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """An iterator over the blob's bytes, or over bytes start..end (inclusive) of it. Checks
        existence now (BlobNotFound), so callers can answer 404 before starting a response; the
        bytes are read lazily, chunk by chunk. The whole blob is checked against its size and
        sha256 as it is read; a range cannot be (a Range request's client checks the whole)."""
        blob = self.info(blob_id)
        if blob.backend == "db":
            chunks = read_chunks(self.session_factory, blob_id, start)
        else:
            if blob.path is None:
                raise BlobCorrupt(f"blob {blob_id} on the {blob.backend!r} backend has no path")
            chunks = self._external_for(blob_id, blob.backend).read(blob.path, blob.size, start)
        if start == 0 and end is None:
            return self._verified(blob, chunks)
        return _first_bytes(chunks, (blob.size if end is None else end + 1) - start)

    @staticmethod
    def _verified(blob: Blob, chunks: Iterator[bytes]) -> Iterator[bytes]:
        meter = Meter(None)
        yield from meter.measure(chunks)
        if meter.size != blob.size or meter.sha256 != blob.sha256:
            raise BlobCorrupt(
                f"blob {blob.id} read back {meter.size} bytes with sha256 {meter.sha256}, "
                f"expected {blob.size} bytes with sha256 {blob.sha256}"
            )

    def read_to_path(self, blob_id: str, path: Path | str) -> Path:
        """Write the blob to `path` atomically (temp file in the same folder, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        chunks = self.open(blob_id)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def presigned_url(self, blob_id: str, content_disposition: str, media_type: str) -> str | None:
        """A URL that downloads the blob straight from S3 without credentials (for a while), or
        None when the blob is not an S3 object this store can sign for."""
        blob = self.info(blob_id)
        if blob.backend != "s3" or self.s3 is None or blob.path is None:
            return None
        return self.s3.presigned_url(blob.path, content_disposition, media_type)

    # ---- deleting --------------------------------------------------------------------------
    def _delete_rows(self, session: Session, blob_id: str) -> tuple[str, str | None] | None:
        """Delete the blob's rows; its (backend, path) as they were, or None if there was none."""
        row = session.execute(select(Blob.backend, Blob.path).where(Blob.id == blob_id)).first()
        session.execute(delete(BlobChunk).where(BlobChunk.blob_id == blob_id))
        session.execute(delete(Blob).where(Blob.id == blob_id))
        return (row.backend, row.path) if row is not None else None

    def delete(self, blob_id: str, session: Session) -> None:
        """Delete in the caller's transaction (delete the rows pointing at it first). Bytes
        outside the database are removed only once that transaction commits."""
        backend, path = self._delete_rows(session, blob_id) or ("db", None)
        if backend == "db" or path is None:
            return
        if backend not in self._external:
            log.warning(
                "blob %s: its %r bytes at %s stay (that backend is not configured)", blob_id, backend, path
            )
            return
        session.info.setdefault(_REMOVALS_KEY, []).append(_Removal(self._external[backend], path))

    def gc_incomplete(self, session: Session, older_than: timedelta = timedelta(hours=6)) -> int:
        """Delete blobs left incomplete (crashed or rolled-back writes) created before
        now - older_than; keep `older_than` above the longest upload. Their bytes outside the
        database (and unfinished S3 uploads older than that) are removed now; a blob whose bytes
        cannot be removed keeps its row for the next round. The caller commits."""
        cutoff = utcnow() - older_than
        rows = session.execute(
            select(Blob.id, Blob.backend, Blob.path).where(Blob.complete.is_(False), Blob.created_at < cutoff)
        ).all()
        deleted = 0
        for blob_id, backend, path in rows:
            if backend != "db" and path is not None:
                external = self._external.get(backend)
                if external is None or not _Removal(external, path, partial=True).run():
                    continue
            self._delete_rows(session, blob_id)
            deleted += 1
        if self.s3 is not None:
            try:
                self.s3.abort_stale_uploads(cutoff)
            except Exception as exc:
                log.warning("could not list the unfinished S3 uploads: %s", exc)
        return deleted


def _first_bytes(chunks: Iterator[bytes], n: int) -> Iterator[bytes]:
    """The first n bytes of `chunks`; the rest is never read (the reader is closed at once)."""
    try:
        for chunk in chunks:
            if n <= 0:
                return
            yield chunk[:n]
            n -= len(chunk)
    finally:
        if isinstance(chunks, Generator):
            chunks.close()


def is_store_outage(error: BaseException) -> bool:
    """The blob store's server (S3, or the database for "db" blobs) was unreachable or failing:
    an outage to wait out, not a fault of the data. Looks through the chain of causes."""
    from core.db_faults import is_connection_error

    seen: BaseException | None = error
    for _ in range(16):  # a chain is short; the bound guards against a cycle
        if seen is None:
            return False
        if is_connection_error(seen) or _is_s3_outage(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _is_s3_outage(error: BaseException) -> bool:
    if not type(error).__module__.startswith("botocore"):
        return False  # not an S3 client's error (and botocore stays unimported without s3)
    from core.blob_backends.s3_client import is_outage

    return is_outage(error)


def blobstore_from_settings(settings: Settings, session_factory: sessionmaker[Session]) -> BlobStore:
    assert settings.blob_backend is not None  # Settings derives it
    s3 = None
    if settings.s3_bucket:  # configured: s3 blobs are readable whatever backend new ones use
        from core.blob_backends.s3 import S3Backend

        s3 = S3Backend(
            settings.s3_bucket,
            prefix=settings.s3_prefix,
            endpoint_url=settings.s3_endpoint_url or None,
            public_endpoint_url=settings.s3_public_endpoint_url or None,
        )
    return BlobStore(session_factory, backend=settings.blob_backend, blob_dir=settings.blob_dir, s3=s3)
