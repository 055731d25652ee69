"""The `s3` backend: one object per blob, key `<prefix><blob id>`, in a bucket of any S3 server
(SeaweedFS, MinIO, AWS).

- Writes stream: the bytes are cut into parts of `part_size` (8 MiB; S3's minimum is 5 MiB) and
  sent as a multipart upload, one part in memory: each is filled in place (a bytearray boto3 sends
  as it is) and the next is made once the last is up. A blob shorter than a part is one PutObject.
  The object exists only once the upload is completed; a write that fails aborts its upload. A
  writer that dies leaves an unfinished upload (invisible, but stored): `remove_partial(key)` and
  `abort_stale_uploads` abort those, and the store's `gc_incomplete` calls both.
- Reads stream too: ranged GETs of `range_size` bytes, each read in `chunk_size` pieces. A range
  whose body breaks off (connection reset, read timeout) is asked again from where it stopped,
  with backoff, up to `max_attempts` tries. A missing object, or one whose length differs from the
  row's, is BlobCorrupt.
- Downloads may skip the API: `presigned_url` signs a GET (valid PRESIGNED_SECONDS) that names the
  file and its media type, against `public_endpoint_url` when clients reach the server elsewhere.
With 8 MiB parts and S3's 10,000 parts per upload, one blob can be up to 78 GiB.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import cached_property
from typing import Any, NoReturn

from core.blob_backends.s3_client import (
    CREDENTIALS_HELP,
    MAX_ATTEMPTS,
    error_code,
    is_missing,
    is_refused,
    is_transport_error,
    make_client,
)
from core.blob_errors import BlobCorrupt, BlobError

log = logging.getLogger(__name__)

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB  # S3 refuses smaller parts (all but the last)
PART_SIZE = 8 * MiB
RANGE_SIZE = 8 * MiB
PRESIGNED_SECONDS = 900
_BLOB_KEY = re.compile(r"blob-[0-9a-f]+")  # what our keys end with (see core.models.new_id)


class S3Backend:
    name = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        public_endpoint_url: str | None = None,
        chunk_size: int = MiB,
        part_size: int = PART_SIZE,
        range_size: int = RANGE_SIZE,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        if not bucket:
            raise ValueError("the 's3' blob backend needs a bucket (FROMSCRATCH_S3_BUCKET)")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum part of {MIN_PART_SIZE} bytes")
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url or None
        self.public_endpoint_url = public_endpoint_url or None
        self.chunk_size = chunk_size
        self.part_size = part_size
        self.range_size = range_size
        self.max_attempts = max_attempts  # tries per request, and per range of a read

    @cached_property
    def client(self) -> Any:
        return make_client(self.endpoint_url, max_attempts=self.max_attempts)

    @cached_property
    def _presigner(self) -> Any:
        if self.public_endpoint_url and self.public_endpoint_url != self.endpoint_url:
            return make_client(self.public_endpoint_url, max_attempts=self.max_attempts)
        return self.client

    def location(self, blob_id: str) -> str:
        return f"{self.prefix}{blob_id}"

    # ---- writing ---------------------------------------------------------------------------
    def write(self, location: str, chunks: Iterable[bytes]) -> None:
        parts = _parts(chunks, self.part_size)
        pending = [next(parts, bytearray())]
        if len(pending[0]) < self.part_size:  # the only part: a plain PUT, stored whole or not at all
            self.client.put_object(Bucket=self.bucket, Key=location, Body=pending.pop())
            return
        self._write_multipart(location, _popping(pending, parts))  # `pending` gives its part up

    def _write_multipart(self, key: str, parts: Iterator[bytearray]) -> None:
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            done: list[dict[str, Any]] = []
            # not enumerate(): it keeps the part it handed out last until it has the next one
            for body in parts:
                number = len(done) + 1
                answer = self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
                )
                done.append({"ETag": answer["ETag"], "PartNumber": number})
                del body  # the part leaves memory before the next is made
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
            )
        except BaseException:
            self._abort(key, upload_id)
            raise

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except Exception as exc:  # the stale-upload sweep of gc_incomplete gets it later
            if error_code(exc) != "NoSuchUpload":
                log.warning("could not abort the upload of s3://%s/%s: %s", self.bucket, key, exc)

    # ---- reading ---------------------------------------------------------------------------
    def read(self, location: str, size: int, start: int = 0) -> Iterator[bytes]:
        if size == 0:  # no range to ask for: check that the (empty) object is there
            self._check_empty(location)
            return
        for first in range(start, size, self.range_size):
            yield from self._read_range(location, first, min(first + self.range_size, size) - 1, size)

    def _check_empty(self, key: str) -> None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            self._raise_as_corrupt_or_itself(exc, key)
        if int(head.get("ContentLength", 0)) != 0:
            raise BlobCorrupt(f"s3://{self.bucket}/{key} holds {head['ContentLength']} bytes, expected 0")

    def _read_range(self, key: str, start: int, end: int, size: int) -> Iterator[bytes]:
        """Bytes start..end (inclusive), resuming a body that breaks off from where it stopped."""
        pos, failures = start, 0
        while pos <= end:
            try:
                body = self._get(key, pos, end, size)
                try:
                    for piece in body.iter_chunks(self.chunk_size):
                        pos += len(piece)
                        yield piece
                finally:
                    body.close()
                if pos <= end:
                    raise BlobCorrupt(f"s3://{self.bucket}/{key} ended at byte {pos}, expected {size}")
            except BlobCorrupt:
                raise
            except Exception as exc:
                failures += 1
                if not is_transport_error(exc) or failures >= self.max_attempts:
                    raise
                log.warning(
                    "reading s3://%s/%s broke off at byte %d (%s); resuming", self.bucket, key, pos, exc
                )
                time.sleep(min(0.2 * 2**failures, 5.0))

    def _get(self, key: str, start: int, end: int, size: int) -> Any:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}")
        except Exception as exc:
            self._raise_as_corrupt_or_itself(exc, key)
        total = str(answer.get("ContentRange", "")).rpartition("/")[2]
        if total != str(size):
            answer["Body"].close()
            raise BlobCorrupt(f"s3://{self.bucket}/{key} holds {total or '?'} bytes, expected {size}")
        return answer["Body"]

    def _raise_as_corrupt_or_itself(self, exc: Exception, key: str) -> NoReturn:
        """A missing object (or a range past its end) is corruption; anything else is raised as it
        is (never `from` itself: a cause that is the error itself loops whoever walks the chain)."""
        if is_missing(exc):
            raise BlobCorrupt(f"blob object s3://{self.bucket}/{key} is missing") from exc
        if error_code(exc) == "InvalidRange":
            raise BlobCorrupt(f"blob object s3://{self.bucket}/{key} is shorter than its row says") from exc
        raise exc

    def presigned_url(self, location: str, content_disposition: str, media_type: str) -> str:
        """A GET URL for the object that needs no credentials, for PRESIGNED_SECONDS."""
        params = {
            "Bucket": self.bucket,
            "Key": location,
            "ResponseContentDisposition": content_disposition,
            "ResponseContentType": media_type,
        }
        return str(
            self._presigner.generate_presigned_url("get_object", Params=params, ExpiresIn=PRESIGNED_SECONDS)
        )

    # ---- removing --------------------------------------------------------------------------
    def remove(self, location: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=location)  # nothing there is fine too

    def remove_partial(self, location: str) -> None:
        for upload in self._uploads(location):
            if upload["Key"] == location:
                self._abort(location, upload["UploadId"])

    def abort_stale_uploads(self, before: datetime) -> int:
        """Abort our unfinished uploads begun before `before` (writers that died, or whose abort
        failed); uploads of keys that are not ours, in a shared bucket, are left alone."""
        aborted = 0
        for upload in self._uploads(self.prefix):
            ours = _BLOB_KEY.fullmatch(upload["Key"][len(self.prefix) :]) is not None
            if ours and upload["Initiated"] <= before:
                self._abort(upload["Key"], upload["UploadId"])
                aborted += 1
        return aborted

    def _uploads(self, prefix: str) -> Iterator[dict[str, Any]]:
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        for page in pages:
            yield from page.get("Uploads", [])

    # ---- the bucket ------------------------------------------------------------------------
    def unusable(self) -> str | None:
        """What makes the bucket unusable with this process's credentials, said plainly: the server
        refuses them, or there is no bucket. None when usable, or unreachable for now (an outage is
        waited out, not a reason to refuse to start)."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            if is_refused(exc):
                return f"the S3 server refuses this process's credentials ({error_code(exc)}): {CREDENTIALS_HELP}"
            if is_missing(exc):
                return f"the S3 bucket {self.bucket!r} does not exist: run `fromscratch migrate` first"
        return None

    def ensure_bucket(self) -> bool:
        """Create the bucket unless it exists; True when it was created."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return False
        except Exception as exc:
            if is_refused(exc):
                raise BlobError(
                    f"the S3 server refuses these credentials for bucket {self.bucket!r} "
                    f"({error_code(exc)}): {CREDENTIALS_HELP}"
                ) from exc
            if not is_missing(exc):
                raise BlobError(f"cannot reach the S3 bucket {self.bucket!r}: {exc}") from exc
        region = self.client.meta.region_name
        where = (
            {}
            if region in (None, "us-east-1")
            else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        )
        self.client.create_bucket(Bucket=self.bucket, **where)
        return True


def _popping(pending: list[bytearray], rest: Iterator[bytearray]) -> Iterator[bytearray]:
    """`pending`'s items, each let go as it is handed out, then `rest`."""
    while pending:
        yield pending.pop(0)
    yield from rest


def _parts(chunks: Iterable[bytes], size: int) -> Iterator[bytearray]:
    """`chunks` as parts of `size` bytes (the last shorter; none for no bytes), each copied once
    into a bytearray of its own. A part is made only when asked for, after the one before has
    been let go: one part (and the input chunk being copied) in memory. (boto3 sends a bytearray
    as it is over http; over https it streams it through a copy: two parts then.)"""
    part: bytearray | None = None
    filled = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while len(view):
            if part is None:
                part, filled = bytearray(size), 0
            n = min(size - filled, len(view))
            with memoryview(part) as target:  # (a bytearray slice assignment would copy view[:n] first)
                target[filled : filled + n] = view[:n]
            filled += n
            view = view[n:]
            if filled == size:
                yield part
                part = None  # dropped before the next is made
    if part is not None:
        del part[filled:]
        yield part
