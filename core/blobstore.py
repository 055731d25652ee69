"""Blob store: bytes for uploads, tokenized data, checkpoints and exports.

Two backends behind one class:
- "db" (default): chunks of `chunk_size` bytes in `blob_chunks`, so a worker on another machine
  needs only the database URL. Streamed both ways: chunks are inserted as they arrive and
  committed every few MiB; reads fetch one chunk per query. Never the whole blob in memory.
- "fs": one file at `<blob_dir>/<xx>/<blob id>`, written to a temp file and renamed into place.

Visibility protocol ("write, then commit the row that points to it"):
1. `put()` inserts the `blobs` row with complete=False and the bytes, committing in its *own*
   short transactions (so a 1 GiB upload never holds one giant transaction or, on SQLite, the
   write lock for the whole upload);
2. at the end it sets size, sha256 and complete=True on the row in the *caller's* session and
   flushes; the caller commits that together with the row that points at the blob (File,
   Checkpoint, Export). If the caller rolls back or the process dies, the blob stays incomplete:
   never readable, and removed by `gc_incomplete()`.
Exception: on SQLite, when the caller's session already holds the (single) write lock, put()
writes through the caller's transaction instead (its own would wait for that lock forever).

Reads dispatch on the row's `backend`, so blobs written before a backend switch stay readable.
Every read checks size and sha256 at the end and raises BlobCorrupt on a mismatch.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from sqlalchemy import delete, event, insert, select
from sqlalchemy.orm import Session, sessionmaker

from core.models import Blob, BlobChunk, new_id, utcnow

if TYPE_CHECKING:
    from core.settings import Settings

CHUNK_SIZE = 1 << 20  # 1 MiB: small enough for any driver, few enough rows for big blobs
COMMIT_EVERY = 4  # chunks per write transaction
_UNLINK_KEY = "fromscratch.blob_unlinks"


class BlobError(Exception):
    pass


class BlobNotFound(BlobError, LookupError):
    def __init__(self, blob_id: str) -> None:
        super().__init__(f"blob {blob_id} does not exist or is not complete")
        self.blob_id = blob_id


class BlobTooLarge(BlobError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the data is larger than the limit of {limit} bytes")
        self.limit = limit


class BlobCorrupt(BlobError):
    pass


def _chunks(stream: Iterable[bytes] | BinaryIO, size: int) -> Iterator[bytes]:
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
        buf += piece
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


def _holds_sqlite_write_lock(session: Session) -> bool:
    if session.get_bind().dialect.name != "sqlite" or not session.in_transaction():
        return False
    # pysqlite opens its transaction at the first write: in_transaction means "holds the lock"
    return bool(getattr(session.connection().connection.dbapi_connection, "in_transaction", False))


# FS deletes happen only once the deleting transaction commits, so a rollback keeps the file.
@event.listens_for(Session, "after_commit")
def _unlink_after_commit(session: Session) -> None:
    for path in session.info.pop(_UNLINK_KEY, ()):
        Path(path).unlink(missing_ok=True)


@event.listens_for(Session, "after_rollback")
def _forget_unlinks(session: Session) -> None:
    session.info.pop(_UNLINK_KEY, None)


class BlobStore:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        backend: str = "db",
        blob_dir: Path | str | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        if backend not in ("db", "fs"):
            raise ValueError(f"unknown blob backend {backend!r}: use 'db' or 'fs'")
        if backend == "fs" and blob_dir is None:
            raise ValueError("the 'fs' blob backend needs blob_dir")
        self.session_factory = session_factory
        self.backend = backend
        self.blob_dir = Path(blob_dir) if blob_dir is not None else None
        self.chunk_size = chunk_size

    # ---- writing ---------------------------------------------------------------------------
    def put(self, stream: Iterable[bytes] | BinaryIO, session: Session, max_bytes: int | None = None) -> Blob:
        """Store the bytes; return the Blob row (complete, flushed, not committed) in `session`.
        Raises BlobTooLarge (after removing everything written) past `max_bytes`."""
        blob_id = new_id("blob")
        # On SQLite a caller that already wrote holds the one write lock: our own transactions
        # would wait for it forever, so write through the caller's transaction instead.
        shared = session if _holds_sqlite_write_lock(session) else None
        try:
            if self.backend == "db":
                size, digest = self._write_db(blob_id, stream, max_bytes, shared)
            else:
                size, digest = self._write_fs(blob_id, stream, max_bytes, shared)
        except BaseException:
            self._discard(blob_id, shared)
            raise
        blob = session.get(Blob, blob_id)
        if blob is None:  # a concurrent gc removed it: treat like a failed write
            raise BlobError(f"blob {blob_id} vanished while being written")
        blob.size, blob.sha256, blob.complete = size, digest, True
        session.flush()
        return blob

    def put_file(self, path: Path | str, session: Session, max_bytes: int | None = None) -> Blob:
        with open(path, "rb") as f:
            return self.put(f, session, max_bytes=max_bytes)

    @contextmanager
    def _writer(self, shared: Session | None) -> Iterator[tuple[Session, bool]]:
        """(session, owned): our own short-transaction session, or the caller's."""
        if shared is not None:
            yield shared, False
            return
        with self.session_factory() as own:
            yield own, True

    def _write_db(
        self, blob_id: str, stream: Iterable[bytes] | BinaryIO, max_bytes: int | None, shared: Session | None
    ) -> tuple[int, str]:
        h, size = hashlib.sha256(), 0
        with self._writer(shared) as (s, owned):
            s.add(Blob(id=blob_id, backend="db", complete=False))
            s.flush()
            for seq, chunk in enumerate(_chunks(stream, self.chunk_size)):
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise BlobTooLarge(max_bytes)
                h.update(chunk)
                # Core-style insert: the chunk is not kept in the session's identity map
                s.execute(insert(BlobChunk).values(blob_id=blob_id, seq=seq, data=chunk))
                if owned and (seq + 1) % COMMIT_EVERY == 0:
                    s.commit()
            if owned:
                s.commit()
        return size, h.hexdigest()

    def _fs_relpath(self, blob_id: str) -> str:
        # fan out on the random part of the id (the "blob-" prefix is the same for all)
        return f"{blob_id.rsplit('-', 1)[-1][:2]}/{blob_id}"

    def _write_fs(
        self, blob_id: str, stream: Iterable[bytes] | BinaryIO, max_bytes: int | None, shared: Session | None
    ) -> tuple[int, str]:
        assert self.blob_dir is not None
        rel = self._fs_relpath(blob_id)
        with self._writer(shared) as (s, owned):  # the row first, so a crash leaves something gc can find
            s.add(Blob(id=blob_id, backend="fs", path=rel, complete=False))
            s.commit() if owned else s.flush()
        final = self.blob_dir / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{blob_id}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        h, size = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as f:
                for chunk in _chunks(stream, self.chunk_size):
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise BlobTooLarge(max_bytes)
                    h.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return size, h.hexdigest()

    def _discard(self, blob_id: str, shared: Session | None) -> None:
        """Remove a failed write: committed chunks, the row and any file."""
        with self._writer(shared) as (s, owned):
            if owned:
                self._delete_rows(s, blob_id)
                s.commit()
            else:
                try:
                    self._delete_rows(s, blob_id)
                except Exception:  # the caller's transaction is broken: its rollback removes the rows
                    pass
        if self.blob_dir is not None:
            self._remove_files(blob_id)

    def _remove_files(self, blob_id: str) -> None:
        assert self.blob_dir is not None
        final = self.blob_dir / self._fs_relpath(blob_id)
        final.unlink(missing_ok=True)
        if final.parent.exists():
            for tmp in final.parent.glob(f"{blob_id}.tmp-*"):
                tmp.unlink(missing_ok=True)

    # ---- reading ---------------------------------------------------------------------------
    def info(self, blob_id: str) -> Blob:
        """The complete Blob row (size, sha256) or BlobNotFound."""
        with self.session_factory() as s:
            blob = s.get(Blob, blob_id)
            if blob is None or not blob.complete:
                raise BlobNotFound(blob_id)
            s.expunge(blob)
            return blob

    def open(self, blob_id: str) -> Iterator[bytes]:
        """An iterator over the blob's bytes. Checks existence now (BlobNotFound), so callers can
        answer 404 before starting a response; the bytes are read lazily, chunk by chunk."""
        blob = self.info(blob_id)
        if blob.backend == "fs":
            if self.blob_dir is None or blob.path is None:
                raise BlobError(f"blob {blob_id} is stored on a filesystem: set FROMSCRATCH_BLOB_DIR")
            return self._verified(blob, self._iter_fs(self.blob_dir / blob.path))
        return self._verified(blob, self._iter_db(blob_id))

    def _iter_db(self, blob_id: str) -> Iterator[bytes]:
        last = -1
        while True:
            # one short query per chunk: bounded memory, no long-lived read transaction
            with self.session_factory() as s:
                row = s.execute(
                    select(BlobChunk.seq, BlobChunk.data)
                    .where(BlobChunk.blob_id == blob_id, BlobChunk.seq > last)
                    .order_by(BlobChunk.seq)
                    .limit(1)
                ).first()
            if row is None:
                return
            last = row.seq
            yield bytes(row.data)

    def _iter_fs(self, path: Path) -> Iterator[bytes]:
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise BlobCorrupt(f"blob file {path} is missing") from None
        with f:
            yield from iter(lambda: f.read(self.chunk_size), b"")

    @staticmethod
    def _verified(blob: Blob, chunks: Iterator[bytes]) -> Iterator[bytes]:
        h, size = hashlib.sha256(), 0
        for chunk in chunks:
            h.update(chunk)
            size += len(chunk)
            yield chunk
        if size != blob.size or h.hexdigest() != blob.sha256:
            raise BlobCorrupt(
                f"blob {blob.id} read back {size} bytes with sha256 {h.hexdigest()}, "
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

    # ---- deleting --------------------------------------------------------------------------
    def _delete_rows(self, session: Session, blob_id: str) -> str | None:
        path = session.scalar(select(Blob.path).where(Blob.id == blob_id))
        session.execute(delete(BlobChunk).where(BlobChunk.blob_id == blob_id))
        session.execute(delete(Blob).where(Blob.id == blob_id))
        return path

    def delete(self, blob_id: str, session: Session) -> None:
        """Delete in the caller's transaction (delete the rows pointing at it first). A file is
        removed only once that transaction commits."""
        path = self._delete_rows(session, blob_id)
        if path is not None and self.blob_dir is not None:
            pending = session.info.setdefault(_UNLINK_KEY, [])
            pending.append(str(self.blob_dir / path))

    def gc_incomplete(self, session: Session, older_than: timedelta = timedelta(hours=6)) -> int:
        """Delete blobs left incomplete (crashed or rolled-back writes) created before
        now - older_than; keep `older_than` above the longest upload. The caller commits."""
        cutoff = utcnow() - older_than
        ids = session.scalars(select(Blob.id).where(Blob.complete.is_(False), Blob.created_at < cutoff)).all()
        for blob_id in ids:
            self.delete(blob_id, session)
            if self.blob_dir is not None:  # temp files of a crashed fs write
                folder = (self.blob_dir / self._fs_relpath(blob_id)).parent
                if folder.exists():
                    pending = session.info.setdefault(_UNLINK_KEY, [])
                    pending.extend(str(p) for p in folder.glob(f"{blob_id}.tmp-*"))
        return len(ids)


def blobstore_from_settings(settings: Settings, session_factory: sessionmaker[Session]) -> BlobStore:
    return BlobStore(session_factory, backend=settings.blob_backend, blob_dir=settings.blob_dir)
