"""The s3 blob backend against a real S3 server (SeaweedFS, tests/fixtures/seaweedfs.py), beyond
the behaviours every backend shares (tests/core/test_blobstore.py runs those on s3 too): blobs of
several multipart parts, ranged reads, objects that are missing or differ from their row, what a
failed or dead writer leaves, reads of blobs of the other backends, retries through a faulty
network hop, and a server that goes away and comes back."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import tracemalloc
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.blob_backends.s3 import MIN_PART_SIZE, S3Backend
from core.blobstore import (
    BlobCorrupt,
    BlobError,
    BlobNotFound,
    BlobStore,
    BlobTooLarge,
    blobstore_from_settings,
)
from core.models import Blob, new_id
from core.settings import Settings
from tests.fixtures.s3_faults import FaultyHop
from tests.fixtures.seaweedfs import SeaweedS3, start_seaweedfs
from tests.fixtures.service import REPO_ROOT, fromscratch_cmd

PART = MIN_PART_SIZE
PIECE = 256 * 1024  # the store's chunk size here
BIG = os.urandom(2 * PART + 12345)  # three parts
SMALL = os.urandom(10_123)


def s3_store(
    factory: sessionmaker[Session],
    server: SeaweedS3,
    prefix: str,
    *,
    backend: str = "s3",
    endpoint_url: str | None = None,
    blob_dir: Path | None = None,
    **options: Any,
) -> BlobStore:
    s3 = S3Backend(
        server.bucket,
        prefix=prefix,
        endpoint_url=endpoint_url or server.endpoint_url,
        chunk_size=PIECE,
        part_size=PART,
        **options,
    )
    return BlobStore(factory, backend=backend, blob_dir=blob_dir, chunk_size=PIECE, s3=s3)


@pytest.fixture
def store(pg_module_factory: sessionmaker[Session], s3_env: SeaweedS3, s3_prefix: str) -> BlobStore:
    return s3_store(pg_module_factory, s3_env, s3_prefix)


def _put(store: BlobStore, data: bytes | Iterator[bytes], **kwargs: Any) -> Blob:
    with store.session_factory() as s:
        blob = store.put(io.BytesIO(data) if isinstance(data, bytes) else data, s, **kwargs)
        s.commit()
    return blob


def _rows_under(store: BlobStore, prefix: str) -> int:
    with store.session_factory() as s:
        return int(s.scalar(select(func.count()).where(Blob.path.startswith(prefix))) or 0)


def _pieces(data: bytes, size: int = 300_001) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_a_blob_of_several_parts_is_visible_only_once_complete(
    store: BlobStore, s3_env: SeaweedS3, s3_prefix: str, tmp_path: Path
) -> None:
    seen: dict[str, list[str]] = {}

    def upload() -> Iterator[bytes]:
        yield from _pieces(BIG)
        # asked for more after the last byte: parts 1 and 2 are up, the short last one is next
        seen.update(uploads=s3_env.uploads(s3_prefix), objects=s3_env.keys(s3_prefix))

    blob = _put(store, upload())
    assert seen == {"uploads": [blob.path], "objects": []}  # an unfinished upload lists no object
    assert s3_env.keys(s3_prefix) == [blob.path] and s3_env.uploads(s3_prefix) == []
    head = s3_env.client().head_object(Bucket=s3_env.bucket, Key=blob.path)
    assert head["ContentLength"] == len(BIG) and head["ETag"].strip('"').endswith("-3")  # 3 parts

    chunks = list(store.open(blob.id))
    assert b"".join(chunks) == BIG and max(len(c) for c in chunks) == PIECE
    assert store.read_to_path(blob.id, tmp_path / "big.bin").read_bytes() == BIG


@pytest.mark.parametrize(("size", "parts"), [(0, 0), (PART - 1, 0), (PART, 1), (PART + 1, 2)])
def test_a_blob_shorter_than_a_part_is_one_put_and_any_other_a_multipart_upload(
    store: BlobStore, s3_env: SeaweedS3, size: int, parts: int
) -> None:
    data = BIG[:size]
    blob = _put(store, _pieces(data))
    etag = s3_env.client().head_object(Bucket=s3_env.bucket, Key=blob.path)["ETag"].strip('"')
    assert etag.endswith(f"-{parts}") if parts else "-" not in etag  # a multipart ETag counts its parts
    assert b"".join(store.open(blob.id)) == data


def test_an_upload_holds_one_part_in_memory(store: BlobStore, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    with open(source, "wb") as f:
        for _ in range(8):
            f.write(os.urandom(PART))
    _put(store, SMALL)  # the client made and its service model loaded before we measure
    tracemalloc.start()
    try:
        with store.session_factory() as s:
            blob = store.put_file(source, s)
            s.commit()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert blob.size == 8 * PART
    # one part, filled in place, and a piece or two of the stream (two parts before issue 22)
    assert peak < 2 * PART, f"peak {peak} bytes while uploading {blob.size}"


@pytest.mark.parametrize("failure", ["client_went_away", "too_large"])
def test_a_failed_multipart_write_leaves_no_blob_and_no_object(
    store: BlobStore, s3_env: SeaweedS3, s3_prefix: str, failure: str
) -> None:
    seen: list[str] = []

    def broken() -> Iterator[bytes]:
        yield from _pieces(BIG)
        seen.extend(s3_env.uploads(s3_prefix))  # two parts are up: the upload is under way
        raise ConnectionResetError("client went away before its last bytes")

    with store.session_factory() as s:
        if failure == "too_large":
            with pytest.raises(BlobTooLarge):
                store.put(_pieces(BIG), s, max_bytes=2 * PART + 10)
        else:
            with pytest.raises(ConnectionResetError):
                store.put(broken(), s)
            assert len(seen) == 1
    assert _rows_under(store, s3_prefix) == 0
    assert s3_env.keys(s3_prefix) == [] and s3_env.uploads(s3_prefix) == []


def test_a_missing_or_changed_object_is_corrupt(store: BlobStore, s3_env: SeaweedS3) -> None:
    client = s3_env.client()
    for stored in (SMALL[:-1], SMALL + b"x", SMALL[:-1] + bytes([SMALL[-1] ^ 1]), None):
        blob = _put(store, SMALL)
        if stored is None:
            client.delete_object(Bucket=s3_env.bucket, Key=blob.path)
        else:
            client.put_object(Bucket=s3_env.bucket, Key=blob.path, Body=stored)
        with pytest.raises(BlobCorrupt):
            b"".join(store.open(blob.id))
    empty = _put(store, b"")
    assert b"".join(store.open(empty.id)) == b""
    client.delete_object(Bucket=s3_env.bucket, Key=empty.path)
    with pytest.raises(BlobCorrupt, match="missing"):
        b"".join(store.open(empty.id))


def test_gc_removes_what_a_dead_writer_left(store: BlobStore, s3_env: SeaweedS3, s3_prefix: str) -> None:
    """A writer killed mid-upload leaves its incomplete row and an unfinished multipart upload; one
    whose row went (its abort failed) leaves only the upload. gc aborts both, never another
    program's uploads in a shared bucket."""
    client = s3_env.client()
    dead = new_id("blob")
    with store.session_factory() as s:
        s.add(Blob(id=dead, backend="s3", path=f"{s3_prefix}{dead}", complete=False))
        s.commit()
    keys = [f"{s3_prefix}{dead}", f"{s3_prefix}{new_id('blob')}", f"{s3_prefix}someone-elses.bin"]
    for key in keys:
        upload = client.create_multipart_upload(Bucket=s3_env.bucket, Key=key)
        client.upload_part(
            Bucket=s3_env.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x"
        )
    assert s3_env.uploads(s3_prefix) == sorted(keys)

    with store.session_factory() as s:
        assert store.gc_incomplete(s, older_than=timedelta(hours=1)) == 0  # too young: maybe in flight
        s.commit()
    assert s3_env.uploads(s3_prefix) == sorted(keys)
    with store.session_factory() as s:
        assert store.gc_incomplete(s, older_than=timedelta(0)) >= 1
        s.commit()
        assert s.get(Blob, dead) is None
    assert s3_env.uploads(s3_prefix) == [keys[2]]
    [foreign] = client.list_multipart_uploads(Bucket=s3_env.bucket, Prefix=keys[2])["Uploads"]
    client.abort_multipart_upload(Bucket=s3_env.bucket, Key=keys[2], UploadId=foreign["UploadId"])


def test_reads_dispatch_on_each_rows_backend(
    pg_module_factory: sessionmaker[Session], s3_env: SeaweedS3, s3_prefix: str, tmp_path: Path
) -> None:
    blob_dir = tmp_path / "blobs"
    old_db = BlobStore(pg_module_factory, backend="db", chunk_size=PIECE)
    old_fs = BlobStore(pg_module_factory, backend="fs", blob_dir=blob_dir, chunk_size=PIECE)
    in_db, on_fs = _put(old_db, SMALL), _put(old_fs, SMALL[::-1])
    s3 = s3_store(pg_module_factory, s3_env, s3_prefix, blob_dir=blob_dir)  # the switch to s3
    in_s3 = _put(s3, BIG)
    assert (in_db.backend, on_fs.backend, in_s3.backend) == ("db", "fs", "s3")
    assert b"".join(s3.open(in_db.id)) == SMALL and b"".join(s3.open(on_fs.id)) == SMALL[::-1]

    # a store writing elsewhere still reads s3 objects when the bucket is configured...
    back_to_db = s3_store(pg_module_factory, s3_env, s3_prefix, backend="db", blob_dir=blob_dir)
    assert b"".join(back_to_db.open(in_s3.id)) == BIG
    with pytest.raises(BlobError, match="FROMSCRATCH_S3_BUCKET"):  # ...and says what is missing if not
        old_db.open(in_s3.id)

    assert s3.presigned_url(in_db.id, "attachment", "text/plain") is None  # not an S3 object
    with pytest.raises(BlobNotFound):
        s3.presigned_url(new_id("blob"), "attachment", "text/plain")

    # deleting removes each blob's bytes where they are, once the transaction commits
    with pg_module_factory() as s:
        s3.delete(on_fs.id, s)
        back_to_db.delete(in_s3.id, s)
        s.rollback()
    assert (blob_dir / str(on_fs.path)).exists() and s3_env.keys(s3_prefix) == [in_s3.path]
    with pg_module_factory() as s:
        s3.delete(on_fs.id, s)
        back_to_db.delete(in_s3.id, s)
        s3.delete(in_db.id, s)
        s.commit()
    assert not (blob_dir / str(on_fs.path)).exists() and s3_env.keys(s3_prefix) == []
    for gone in (in_db, on_fs, in_s3):
        with pytest.raises(BlobNotFound):
            s3.open(gone.id)


def test_retries_5xx_answers_and_resumes_a_broken_read(
    pg_module_factory: sessionmaker[Session], s3_env: SeaweedS3, s3_prefix: str
) -> None:
    with FaultyHop(s3_env.ports["s3"]) as hop:
        store = s3_store(pg_module_factory, s3_env, s3_prefix, endpoint_url=hop.url, range_size=2 * PART)
        hop.fail("PUT", times=2, path_has="partNumber=")  # the first two part uploads: 503 SlowDown
        hop.fail("POST", times=1, status=500, path_has="uploadId=")  # the completion: 500 once
        blob = _put(store, BIG)
        assert hop.answered("PUT", 503) == 2 and hop.answered("POST", 500) == 1

        hop.fail("GET", times=1)  # a 503 before the first range
        hop.cut("GET", after=PART + 4321)  # its retry breaks off mid-body: resumed from there
        assert b"".join(store.open(blob.id)) == BIG
        gets = [(path, status) for method, path, status in hop.requests if method == "GET"]
        assert [status for _, status in gets] == [503, 206, 206, 206]  # 2 ranges, the first resumed

        hop.fail("PUT", times=100)  # a server that keeps failing: the put gives up, leaves nothing
        limited = s3_store(pg_module_factory, s3_env, s3_prefix, endpoint_url=hop.url, max_attempts=2)
        before = hop.answered("PUT", 503)
        with pytest.raises(ClientError), limited.session_factory() as s:
            limited.put([SMALL], s)
        assert hop.answered("PUT", 503) - before == 2  # two tries, as configured
    assert s3_env.keys(s3_prefix) == [blob.path] and _rows_under(store, s3_prefix) == 1


def test_a_server_that_goes_away_and_comes_back(
    pg_module_factory: sessionmaker[Session], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own server, killed by PID and started again on the same data: the write that failed
    meanwhile is invisible, keeps its row (its object could not be checked), and gc removes it
    once the server is back; what was stored before is intact."""
    server = start_seaweedfs(tmp_path / "seaweedfs")
    try:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        store = s3_store(pg_module_factory, server, "own/", max_attempts=2)
        kept = _put(store, BIG)
        server.stop()
        with pytest.raises(BotoCoreError), store.session_factory() as s:
            store.put([SMALL], s)
        assert _rows_under(store, "own/") == 2
        server.start()
        with store.session_factory() as s:
            assert store.gc_incomplete(s, older_than=timedelta(0)) >= 1
            s.commit()
        assert _rows_under(store, "own/") == 1 and server.keys("own/") == [kept.path]
        assert b"".join(store.open(kept.id)) == BIG
    finally:
        server.destroy()


def test_settings_choose_the_s3_store_and_migrate_makes_the_bucket(
    s3_env: SeaweedS3, s3_prefix: str, tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        database_url="",
        broker_url="",
        blob_backend="s3",
        s3_endpoint_url=s3_env.endpoint_url,
        s3_bucket=f"made-{secrets.token_hex(6)}",
        s3_prefix=s3_prefix,
    )
    store = blobstore_from_settings(settings, session_factory)
    assert store.backend == "s3" and store.s3 is not None
    assert (store.s3.bucket, store.s3.prefix, store.s3.endpoint_url) == (
        settings.s3_bucket,
        s3_prefix,
        s3_env.endpoint_url,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env.update(
        {f"FROMSCRATCH_{k.upper()}": str(v) for k, v in settings.model_dump().items() if v is not None}
    )
    for expected in ("created", "exists"):  # `fromscratch migrate` makes the bucket, once
        done = subprocess.run(
            fromscratch_cmd("migrate"), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert f"S3 bucket {settings.s3_bucket!r} {expected}" in done.stdout
    s3_env.client().head_bucket(Bucket=settings.s3_bucket)
    s3_env.client().delete_bucket(Bucket=settings.s3_bucket)
