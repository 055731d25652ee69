"""The `db` backend: a blob's bytes as numbered chunks in `blob_chunks`, so a worker on another
machine needs only the database URL. Streamed both ways: chunks are inserted as they arrive and
committed every few (when the store writes through a session of its own); reads fetch one chunk
per query, never the whole blob."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from core.models import BlobChunk

COMMIT_EVERY = 4  # chunks per write transaction


def write_chunks(session: Session, blob_id: str, chunks: Iterable[bytes], owned: bool) -> None:
    """Insert `chunks` as the blob's rows; commit every COMMIT_EVERY of them when `owned` (our
    own session: short transactions), else leave them to the caller's transaction."""
    for seq, chunk in enumerate(chunks):
        # Core-style insert: the chunk is not kept in the session's identity map
        session.execute(insert(BlobChunk).values(blob_id=blob_id, seq=seq, data=chunk))
        if owned and (seq + 1) % COMMIT_EVERY == 0:
            session.commit()


def read_chunks(session_factory: sessionmaker[Session], blob_id: str, start: int = 0) -> Iterator[bytes]:
    """The blob's bytes from byte `start` on, a chunk per query."""
    last, skip = _chunk_before(session_factory, blob_id, start) if start else (-1, 0)
    while True:
        # one short query per chunk: bounded memory, no long-lived read transaction
        with session_factory() as s:
            row = s.execute(
                select(BlobChunk.seq, BlobChunk.data)
                .where(BlobChunk.blob_id == blob_id, BlobChunk.seq > last)
                .order_by(BlobChunk.seq)
                .limit(1)
            ).first()
        if row is None:
            return
        last = row.seq
        yield bytes(row.data[skip:]) if skip else bytes(row.data)
        skip = 0


def _chunk_before(session_factory: sessionmaker[Session], blob_id: str, start: int) -> tuple[int, int]:
    """(the seq of the chunk before the one holding byte `start`, start's offset in its chunk), from
    the chunks' lengths alone (their bytes are not read)."""
    with session_factory() as s:
        lengths = s.execute(
            select(BlobChunk.seq, func.length(BlobChunk.data))
            .where(BlobChunk.blob_id == blob_id)
            .order_by(BlobChunk.seq)
        ).all()
    before, last = 0, -1
    for seq, length in lengths:
        if before + length > start:
            return last, start - before
        before, last = before + length, seq
    return last, 0
