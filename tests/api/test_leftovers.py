"""What a killed API process leaves behind (issue 25, finding 3), with real kill -9s of a live
uvicorn API: killed mid-body, its temporary upload file stays in `work_dir/uploads`; killed while
storing, its temporary file and an incomplete blob (chunk rows in the db backend) stay. The next API
process collects both at start-up and on its periodic sweep (api/leftovers.py): the temporary file
once untouched for upload_leftover_seconds, the blob once its writer's heartbeat is older than
blob_writer_timeout_seconds (core/blob_gc.py), not after hours. Prints the figures (run with -s)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import func, select

from api.leftovers import upload_dir
from core.models import Blob, BlobChunk
from tests.fixtures.service import LiveServer, _wait_http_ok, wait_until

MiB = 1 << 20
BOUNDARY = "leftoverboundary"


def temp_files(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in folder.glob("upload-*") if p.is_file()}


def blobs_of(live_server: LiveServer, session_factory: Any, writer: str) -> dict[str, int]:
    """The incomplete blobs `writer` left: {id: MiB written} (db: its chunk rows; fs: its temp file)."""
    with session_factory() as session:
        rows = session.execute(
            select(Blob.id, func.count(BlobChunk.seq))
            .outerjoin(BlobChunk, BlobChunk.blob_id == Blob.id)
            .where(Blob.writer == writer, Blob.complete.is_(False))
            .group_by(Blob.id)
        ).all()
    blob_dir = live_server.settings.blob_dir
    return {
        blob_id: int(n) + sum(p.stat().st_size for p in blob_dir.glob(f"*/{blob_id}.tmp-*")) // MiB
        for blob_id, n in rows
    }


def fs_temp_files(live_server: LiveServer) -> list[Path]:
    return list(live_server.settings.blob_dir.glob("*/*.tmp-*"))


def start_body_and_stall(live_server: LiveServer, announced: int, sent: int) -> socket.socket:
    """A multipart upload that announces `announced` bytes, sends `sent` of its file part, then
    nothing more (the connection stays open)."""
    url = urlsplit(live_server.url)
    sock = socket.create_connection((url.hostname, url.port))
    part = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n"
    ).encode()
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {live_server.api_key}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {announced}\r\n\r\n"
    ).encode()
    sock.sendall(head + part)
    line = b"the quick brown fox jumps over the lazy dog\n" * (MiB // 44)
    for _ in range(sent // len(line)):
        sock.sendall(line)
    return sock


def upload_in_background(live_server: LiveServer, data: bytes) -> threading.Thread:
    def send() -> None:
        try:
            httpx.post(
                f"{live_server.url}/v1/files",
                headers=live_server.headers(),
                files={"file": ("big.txt", data, "text/plain")},
                data={"purpose": "fine-tune"},
                timeout=300,
            )
        except httpx.HTTPError:
            pass  # the server was killed under it

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def writer_of(process_pid: int) -> str:
    return f"{socket.gethostname()}:{process_pid}"


@pytest.mark.parametrize(
    "backend",
    [pytest.param(name, marks=pytest.mark.service_settings(blob_backend=name)) for name in ("db", "fs")],
)
def test_what_a_killed_api_leaves_is_collected_by_the_next(
    live_server: LiveServer, session_factory: Any, backend: str
) -> None:
    api = live_server.process
    uploads = upload_dir(live_server.settings)
    before_files = set(temp_files(uploads))

    # 1. kill -9 mid-body: the temporary file holds what arrived
    sock = start_body_and_stall(live_server, announced=300 * MiB, sent=24 * MiB)
    wait_until(
        lambda: any(n >= 16 * MiB for p, n in temp_files(uploads).items() if p not in before_files),
        message="the upload's temporary file",
    )
    api.kill()
    sock.close()

    # 2. kill -9 while storing: a complete body, then killed once the blob has chunk rows
    api.start()
    _wait_http_ok(f"{live_server.url}/healthz", api)
    writer = writer_of(api.pid)
    data = b"the quick brown fox jumps over the lazy dog\n" * (160 * MiB // 44)
    thread = upload_in_background(live_server, data)
    wait_until(
        lambda: (
            any(n >= 8 for n in blobs_of(live_server, session_factory, writer).values())
            if backend == "db"
            else fs_temp_files(live_server)  # fs writes fast: catch its temporary file at all
        ),
        timeout=120,
        interval=0.05,
        message=lambda: f"the upload's blob to be written\n{api.output()}",
    )
    api.kill()
    thread.join(timeout=60)
    left_files = {p: n for p, n in temp_files(uploads).items() if p not in before_files}
    left_blobs = blobs_of(live_server, session_factory, writer)
    assert len(left_files) == 2 and len(left_blobs) == 1, (left_files, left_blobs)
    assert (backend == "fs") == bool(fs_temp_files(live_server))
    what = "chunk rows" if backend == "db" else "MiB in its temporary file"
    print(
        f"\n{backend}: left by two kill -9s: temporary uploads of "
        f"{sorted(round(n / MiB) for n in left_files.values())} MiB, an incomplete blob of "
        f"{sum(left_blobs.values())} {what}"
    )

    # 3. the next API process, its bounds short for the test, collects both
    api.env.update(
        FROMSCRATCH_UPLOAD_LEFTOVER_SECONDS="1",
        FROMSCRATCH_BLOB_WRITER_TIMEOUT_SECONDS="2",
        FROMSCRATCH_LEFTOVER_SWEEP_SECONDS="0.5",
    )
    started = time.monotonic()
    api.start()
    _wait_http_ok(f"{live_server.url}/healthz", api)
    wait_until(
        lambda: (
            not (set(temp_files(uploads)) & set(left_files))
            and not blobs_of(live_server, session_factory, writer)
        ),
        timeout=60,
        message=lambda: f"the leftovers to be collected\n{api.output()}",
    )
    print(f"collected {time.monotonic() - started:.1f} s after the next API process started")
    with session_factory() as session:
        assert session.scalar(select(func.count()).where(BlobChunk.blob_id.in_(list(left_blobs)))) == 0
    assert not fs_temp_files(live_server)
