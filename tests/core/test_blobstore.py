import hashlib
import io
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.blob_backends.s3 import S3Backend
from core.blobstore import BlobCorrupt, BlobNotFound, BlobStore, BlobTooLarge, blobstore_from_settings
from core.models import Blob, BlobChunk
from core.settings import Settings

CHUNK = 1000  # small chunks: multi-chunk behaviour without megabytes of test data
DATA = os.urandom(10 * CHUNK + 123)


@pytest.fixture(params=["db", "fs", "s3"])
def store(request: pytest.FixtureRequest, any_factory: sessionmaker[Session], tmp_path: Path) -> BlobStore:
    s3 = None
    if request.param == "s3":  # the real SeaweedFS of the session, under a prefix of this test's own
        server = request.getfixturevalue("s3_env")
        prefix = request.getfixturevalue("s3_prefix")
        s3 = S3Backend(server.bucket, prefix=prefix, endpoint_url=server.endpoint_url, chunk_size=CHUNK)
    return BlobStore(any_factory, backend=request.param, blob_dir=tmp_path / "blobs", chunk_size=CHUNK, s3=s3)


def _pieces(data: bytes, sizes: tuple[int, ...] = (1, 999, 1500, 7, 4000)) -> Iterator[bytes]:
    """Irregular pieces, as a network upload delivers them."""
    i = 0
    while i < len(data):
        for n in sizes:
            yield data[i : i + n]
            i += n


def _objects(store: BlobStore) -> list[str]:
    """The keys under the store's S3 prefix, and those of its unfinished multipart uploads."""
    if store.s3 is None:
        return []
    answer = store.s3.client.list_objects_v2(Bucket=store.s3.bucket, Prefix=store.s3.prefix)
    uploads = store.s3.client.list_multipart_uploads(Bucket=store.s3.bucket, Prefix=store.s3.prefix)
    return [o["Key"] for o in answer.get("Contents", [])] + [u["Key"] for u in uploads.get("Uploads", [])]


def _counts(store: BlobStore) -> tuple[int, int, int]:
    """Blob rows, chunk rows, and files or objects (with unfinished uploads)."""
    with store.session_factory() as s:
        blobs = s.scalar(select(func.count()).select_from(Blob))
        chunks = s.scalar(select(func.count()).select_from(BlobChunk))
    files = sum(1 for p in store.blob_dir.rglob("*") if p.is_file()) if store.blob_dir.exists() else 0
    return blobs, chunks, files + len(_objects(store))


@pytest.mark.parametrize("source", ["iterable", "file"])
def test_round_trip(store: BlobStore, source: str, tmp_path: Path) -> None:
    stream = _pieces(DATA) if source == "iterable" else io.BytesIO(DATA)
    with store.session_factory() as s:
        blob = store.put(stream, s)
        s.commit()
    assert (blob.size, blob.sha256, blob.complete) == (len(DATA), hashlib.sha256(DATA).hexdigest(), True)
    assert blob.backend == store.backend

    chunks = list(store.open(blob.id))
    assert b"".join(chunks) == DATA
    assert all(len(c) <= CHUNK for c in chunks) and len(chunks) == 11
    out = store.read_to_path(blob.id, tmp_path / "out" / "copy.bin")
    assert out.read_bytes() == DATA
    assert [p.name for p in out.parent.iterdir()] == ["copy.bin"]  # no temp file left
    assert store.info(blob.id).size == len(DATA)

    with store.session_factory() as s:
        n_chunks = s.scalar(select(func.count()).where(BlobChunk.blob_id == blob.id))
    if store.backend == "db":
        assert n_chunks == 11
    elif store.backend == "fs":
        assert n_chunks == 0 and (store.blob_dir / blob.path).read_bytes() == DATA
    else:
        assert store.s3 is not None and n_chunks == 0 and _objects(store) == [blob.path]
        assert store.s3.client.get_object(Bucket=store.s3.bucket, Key=blob.path)["Body"].read() == DATA


def test_put_file_and_empty_blob(store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_bytes(b"hello\n" * 500)
    with store.session_factory() as s:
        blob = store.put_file(src, s)
        empty = store.put([], s)
        s.commit()
    assert b"".join(store.open(blob.id)) == src.read_bytes()
    assert (empty.size, empty.sha256) == (0, hashlib.sha256(b"").hexdigest())
    assert b"".join(store.open(empty.id)) == b""


def test_too_large_leaves_nothing_behind(store: BlobStore) -> None:
    before = _counts(store)
    with store.session_factory() as s:
        with pytest.raises(BlobTooLarge) as info:
            store.put(_pieces(DATA), s, max_bytes=len(DATA) - 1)
        s.commit()
    assert info.value.limit == len(DATA) - 1
    assert _counts(store) == before
    with store.session_factory() as s:  # exactly at the limit is fine
        store.put(_pieces(DATA), s, max_bytes=len(DATA))
        s.commit()


def test_incomplete_blob_is_invisible_and_cleaned_up(store: BlobStore) -> None:
    before = _counts(store)
    seen: dict[str, object] = {}

    def broken_upload() -> Iterator[bytes]:
        for i, piece in enumerate(_pieces(DATA, (CHUNK,))):
            yield piece
            if i == 6:  # some chunks committed by now: the row exists but is incomplete
                with store.session_factory() as other:
                    row = other.scalars(
                        select(Blob).where(Blob.complete.is_(False)).order_by(Blob.created_at.desc())
                    ).first()
                seen["complete"] = row.complete
                with pytest.raises(BlobNotFound):
                    store.open(row.id)
                raise ConnectionResetError("client went away")

    with store.session_factory() as s:
        with pytest.raises(ConnectionResetError):
            store.put(broken_upload(), s)
    assert seen == {"complete": False}
    assert _counts(store) == before


def test_caller_rollback_leaves_an_incomplete_blob_for_gc(store: BlobStore) -> None:
    before = _counts(store)
    with store.session_factory() as s:
        blob_id = store.put(_pieces(DATA), s).id
        s.rollback()  # e.g. the File row failed to insert
    with pytest.raises(BlobNotFound):
        store.open(blob_id)
    with store.session_factory() as s:
        assert store.gc_incomplete(s, older_than=timedelta(hours=1)) == 0  # too young: maybe in flight
        assert store.gc_incomplete(s, older_than=timedelta(0)) == 1
        s.commit()
    assert _counts(store) == before


def test_delete_happens_only_on_commit(store: BlobStore) -> None:
    before = _counts(store)
    with store.session_factory() as s:
        blob = store.put(_pieces(DATA), s)
        s.commit()
    with store.session_factory() as s:
        store.delete(blob.id, s)
        s.rollback()
    assert b"".join(store.open(blob.id)) == DATA
    with store.session_factory() as s:
        store.delete(blob.id, s)
        s.commit()
    with pytest.raises(BlobNotFound):
        store.open(blob.id)
    assert _counts(store) == before


def test_corruption_is_detected(store: BlobStore) -> None:
    with store.session_factory() as s:
        blob = store.put(_pieces(DATA), s)
        s.commit()
    if store.backend == "db":
        with store.session_factory() as s:
            s.execute(
                update(BlobChunk)
                .where(BlobChunk.blob_id == blob.id, BlobChunk.seq == 3)
                .values(data=b"x" * CHUNK)
            )
            s.commit()
    elif store.backend == "fs":
        (store.blob_dir / blob.path).write_bytes(DATA[:-1])
    else:  # the same length, one byte changed: only the sha256 can tell
        assert store.s3 is not None
        changed = DATA[:500] + bytes([DATA[500] ^ 1]) + DATA[501:]
        store.s3.client.put_object(Bucket=store.s3.bucket, Key=blob.path, Body=changed)
    with pytest.raises(BlobCorrupt):
        b"".join(store.open(blob.id))


def test_from_settings(settings: Settings, session_factory: sessionmaker[Session]) -> None:
    store = blobstore_from_settings(settings, session_factory)
    assert (store.backend, store.blob_dir) == ("db", settings.blob_dir)
    fs = blobstore_from_settings(settings.model_copy(update={"blob_backend": "fs"}), session_factory)
    assert fs.backend == "fs"


def test_several_puts_in_one_transaction(store: BlobStore) -> None:
    """A worker storing a checkpoint and an export in one transaction (on SQLite the second put
    runs inside the caller's write transaction); a failure cleans up only its own blob."""
    before = _counts(store)
    with store.session_factory() as s:
        first = store.put(_pieces(DATA), s)
        second = store.put(io.BytesIO(DATA[:1500]), s)
        with pytest.raises(BlobTooLarge):
            store.put(_pieces(DATA), s, max_bytes=10)
        s.commit()
    assert b"".join(store.open(first.id)) == DATA
    assert b"".join(store.open(second.id)) == DATA[:1500]
    blobs, _, files = _counts(store)
    assert blobs == before[0] + 2 and files == before[2] + (0 if store.backend == "db" else 2)
