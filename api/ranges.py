"""Byte ranges on downloads (RFC 9110 section 14): a client that lost a 1 GB model download asks for
the rest with `Range: bytes=N-` and gets 206 with those bytes. One range per request (several ranges
in one request would be a multipart answer no download client needs: they get the whole file, as
the RFC allows). `If-Range` with the ETag (the file's sha256) makes sure the rest is of the same
file; a stale one gets the whole file. A range outside the file answers 416 with its size."""

from __future__ import annotations

import re
from collections.abc import Iterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from api.errors import APIError
from core.blobstore import BlobStore

_SINGLE = re.compile(r"bytes=(\d*)-(\d*)")


class RangeNotSatisfiable(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(f"the range asked for is outside the file's {size:,} bytes")
        self.size = size


def requested_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte, inclusive, of a single-range `Range` header; None: the whole file (no
    header, another unit, several ranges, or a malformed one, which the RFC says to ignore).
    RangeNotSatisfiable when the range starts past the end."""
    if not header or (m := _SINGLE.fullmatch(header.strip())) is None:
        return None
    first, last = m.groups()
    if not first and not last:
        return None
    if not first:  # bytes=-N: the last N bytes
        if int(last) == 0 or size == 0:
            raise RangeNotSatisfiable(size)
        return max(0, size - int(last)), size - 1
    start = int(first)
    if last and int(last) < start:
        return None  # an invalid range is ignored
    if start >= size:
        raise RangeNotSatisfiable(size)
    return start, min(int(last), size - 1) if last else size - 1


def etag(sha256: str) -> str:
    return f'"{sha256}"'


def download_response(
    request: Request,
    store: BlobStore,
    blob_id: str,
    media_type: str,
    headers: dict[str, str],
) -> StreamingResponse:
    """The blob as a 200, or as a 206 of the range asked for; its size and ETag from the store."""
    blob = store.info(blob_id)
    tag = etag(blob.sha256 or blob.id)  # complete blobs have their sha256
    common = {**headers, "Accept-Ranges": "bytes", "ETag": tag}
    if_range = request.headers.get("if-range")
    wanted = None if if_range is not None and if_range != tag else request.headers.get("range")
    try:
        found = requested_range(wanted, blob.size)
    except RangeNotSatisfiable as exc:
        raise APIError(
            416, str(exc), param="Range", code="range_not_satisfiable",
            headers={**common, "Content-Range": f"bytes */{exc.size}"}, retry=False,
        ) from None  # fmt: skip
    if found is None:
        chunks = first_read(store.open(blob_id))
        return StreamingResponse(
            chunks, media_type=media_type, headers={**common, "Content-Length": str(blob.size)}
        )
    start, end = found
    ranged = {
        **common,
        "Content-Length": str(end - start + 1),
        "Content-Range": f"bytes {start}-{end}/{blob.size}",
    }
    return StreamingResponse(
        first_read(store.open(blob_id, start, end)), status_code=206, media_type=media_type, headers=ranged
    )


def first_read(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """`chunks` with its first chunk read now, before the response's headers are sent: a store that
    cannot serve the blob (an S3 outage) fails the request with a 503, not a 200 cut short."""
    first = next(chunks, None)

    def stream() -> Iterator[bytes]:
        try:
            if first is not None:
                yield first
                yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    return stream()
