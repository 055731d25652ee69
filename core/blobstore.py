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
   never readable, and removed by `gc_incomplete()` with whatever bytes it left (a temp file, an
   object, an unfinished upload) once its writer's heartbeat stops (core/blob_writers.py, blob_gc.py).
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
from core.blob_errors import BlobCorrupt, BlobError, BlobNotFound, BlobTooLarge, is_store_outage
from core.blob_gc import collect_incomplete
from core.blob_writers import blob_heartbeat, writer_id
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


def _incomplete_row(blob_id: str, backend: str, path: str | None = None) -> Blob:
    return Blob(  # naming this process as its writer (core/blob_writers.py)
        id=blob_id, backend=backend, path=path, complete=False, writer=writer_id(), heartbeat_at=utcnow()
    )


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
        heartbeat_seconds: float = 10.0,
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
        self.writers = blob_heartbeat(session_factory, heartbeat_seconds)  # rows being written
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
        written = self._write(stream, self._shared(session), max_bytes)
        try:
            return self._complete(session, *written)
        finally:
            self.writers.discard(written[0])

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
            self.writers.discard(*(blob_id for blob_id, _ in written))
            for blob_id, _ in written:
                self._discard(blob_id, shared)
            raise
        try:  # the heartbeat keeps the first ones alive while the last are written
            return [self._complete(session, blob_id, meter) for blob_id, meter in written]
        finally:
            self.writers.discard(*(blob_id for blob_id, _ in written))

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
            self.writers.discard(blob_id)
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
            s.add(_incomplete_row(blob_id, "db"))
            s.commit() if owned else s.flush()  # the row first: its heartbeat is seen from the start
            if owned:  # (the caller's transaction shows no one: nothing to keep alive)
                self.writers.add(blob_id)
            write_chunks(s, blob_id, chunks, owned)
            if owned:
                s.commit()

    def _write_external(
        self, backend: ExternalBackend, blob_id: str, chunks: Iterable[bytes], shared: Session | None
    ) -> None:
        location = backend.location(blob_id)
        with self._writer(shared) as (s, owned):  # the row first, so a crash leaves something gc can find
            s.add(_incomplete_row(blob_id, backend.name, location))
            s.commit() if owned else s.flush()
        if owned:
            self.writers.add(blob_id)
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

    def gc_incomplete(
        self,
        session: Session,
        older_than: timedelta = timedelta(hours=6),
        writer_timeout: timedelta | None = None,
    ) -> int:
        """Delete incomplete blobs (killed or rolled-back writes) whose writer was silent past
        `writer_timeout` (rows from before writers beat: created before now - older_than), with their
        bytes, and unfinished S3 uploads older than `older_than` (core/blob_gc.py). The caller commits."""
        deleted = collect_incomplete(session, self._external, older_than, writer_timeout)
        if self.s3 is not None:
            try:
                self.s3.abort_stale_uploads(utcnow() - older_than)
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
    beat = min(settings.heartbeat_seconds, settings.blob_writer_timeout_seconds / 3)
    return BlobStore(session_factory, settings.blob_backend, settings.blob_dir, s3=s3, heartbeat_seconds=beat)
