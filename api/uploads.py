"""Receiving a multipart/form-data upload as it streams in, with python-multipart's public
`MultipartParser` fed from `request.stream()`:

- the `file` part goes straight to a named temporary file in `upload_dir` (written in 1 MiB pieces
  from a worker thread), never whole in memory; the other parts are small form fields (at most 16,
  64 KiB each) kept as text;
- the body is cut off with a 400 (`file_too_large`, param "file") as soon as it passes the upload
  limit plus room for the multipart framing; a caller's `check_file_bytes(n)` sees the file part's
  running size after every piece and may cut it off too (the storage quota's 429);
- a malformed or truncated body (no closing boundary) is a 400 (`invalid_multipart`);
- a client that sends nothing for `body_timeout` seconds (setting `upload_body_timeout_seconds`)
  mid-body gets a 408 (`upload_timeout`) and its connection is closed: a client that announces more
  bytes than it sends holds neither a connection nor a temporary file for longer than that;
- a client that goes away mid-upload ends it with a 400 (`upload_aborted`, which only the request
  metrics see) and one line in the log, not a traceback;
- the part's filename is kept without control characters (NUL, escapes, bidi overrides);
- the temporary file exists only inside `received_upload(...)`: it is removed on the way out,
  whatever happened, so a failed upload leaves nothing behind.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import unicodedata
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import anyio
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect

from api.errors import APIError

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

log = logging.getLogger("fromscratch.api")

FILE_FIELD = "file"
WRITE_BYTES = 1 << 20  # write the file part in pieces of about this size
MULTIPART_SLACK = 64 * 1024  # headers and boundaries around the file part
MAX_FIELDS = 16
MAX_FIELD_BYTES = 64 * 1024


def too_large(limit: int) -> APIError:
    return APIError(
        400,
        f"The file is larger than the upload limit of {limit} bytes (setting FROMSCRATCH_MAX_UPLOAD_BYTES).",
        param="file",
        code="file_too_large",
    )


def body_timeout(seconds: float) -> APIError:
    return APIError(
        408,
        f"The upload sent nothing for {seconds:g} s before its end (setting "
        "FROMSCRATCH_UPLOAD_BODY_TIMEOUT_SECONDS); send the whole body, or a Content-Length that matches it.",
        param="file",
        code="upload_timeout",
        headers={"Connection": "close"},  # what is left of the body is not read
    )


def invalid_multipart(reason: str) -> APIError:
    return APIError(400, f"Invalid multipart body: {reason}", param="file", code="invalid_multipart")


def multipart_boundary(content_type: str | None) -> bytes:
    """The boundary of a multipart/form-data Content-Type; 400 for any other body."""
    media_type, options = parse_options_header(content_type)
    if media_type != b"multipart/form-data":
        raise APIError(
            400,
            "Upload files as multipart/form-data with a `file` part and `purpose=fine-tune`.",
            param="file",
            code="invalid_content_type",
        )
    boundary = options.get(b"boundary")
    if not boundary:
        raise invalid_multipart("the Content-Type has no boundary")
    return boundary


def clean_filename(name: str) -> str:
    """The filename without control or format characters (NUL, ANSI escapes, bidi overrides), which
    have no business in a name that is shown in listings and terminals."""
    return "".join(ch for ch in name if unicodedata.category(ch) not in ("Cc", "Cf")).strip()


def safe_suffix(filename: str) -> str:
    """Keep a short alphanumeric extension (format detection looks at `.jsonl`)."""
    suffix = Path(filename).suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,10}", suffix) else ""


@dataclass
class Upload:
    """What a multipart body held: the `file` part's temporary copy (None when it had none) and
    the other form fields."""

    path: Path | None = None
    filename: str = ""
    fields: dict[str, str] = field(default_factory=dict)


class _PartCollector:
    """MultipartParser callbacks: form fields are collected as text; the bytes of the `file` part
    are queued in `pending` for the caller to write (callbacks run on the event loop, so they do
    no file I/O); any other file part is read and dropped."""

    def __init__(self) -> None:
        self.upload = Upload()
        self.file_started = False  # the `file` part's headers have arrived
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.file_bytes = 0  # the `file` part's bytes so far
        self.ended = False
        self._files_seen = 0
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._kind: str = "skip"  # "file" | "field" | "skip"
        self._field_name = ""
        self._field_value = bytearray()

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._header_name.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._headers = {}
        self._kind = "skip"

    def _header_end(self) -> None:
        self._headers[bytes(self._header_name).lower()] = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in options:
            self._files_seen += 1
            if self._files_seen > 1:
                raise invalid_multipart("send one file per upload")
            if name == FILE_FIELD:
                self._kind = "file"
                self.file_started = True
                self.upload.filename = clean_filename(options[b"filename"].decode("utf-8", "replace"))
            return
        if len(self.upload.fields) >= MAX_FIELDS:
            raise invalid_multipart(f"more than {MAX_FIELDS} form fields")
        self._kind = "field"
        self._field_name = name
        self._field_value.clear()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._kind == "file":
            self.pending.append(data[start:end])
            self.pending_bytes += end - start
            self.file_bytes += end - start
        elif self._kind == "field":
            self._field_value.extend(data[start:end])
            if len(self._field_value) > MAX_FIELD_BYTES:
                raise invalid_multipart(
                    f"the form field {self._field_name!r} is over {MAX_FIELD_BYTES} bytes"
                )

    def _part_end(self) -> None:
        if self._kind == "field":
            self.upload.fields[self._field_name] = self._field_value.decode("utf-8", "replace")

    def _end(self) -> None:
        self.ended = True

    def take_pending(self) -> bytes:
        data = b"".join(self.pending)
        self.pending.clear()
        self.pending_bytes = 0
        return data


def _open_temp(upload_dir: Path, filename: str) -> tuple[BinaryIO, Path]:
    fd, name = tempfile.mkstemp(dir=upload_dir, prefix="upload-", suffix=safe_suffix(filename))
    return os.fdopen(fd, "w+b"), Path(name)


async def _read_body(
    request: Request,
    parser: MultipartParser,
    parts: _PartCollector,
    upload_dir: Path,
    limit: int,
    check_file_bytes: Callable[[int], None] | None,
    timeout: float | None,
) -> None:
    """Feed the body to the parser; the `file` part's bytes go on to `parts.upload.path`."""
    fh: BinaryIO | None = None
    seen = 0
    chunks = request.stream()
    try:
        while (chunk := await _next_chunk(chunks, timeout)) is not None:
            seen += len(chunk)
            if seen > limit + MULTIPART_SLACK:
                raise too_large(limit)
            parser.write(chunk)
            if check_file_bytes is not None:
                check_file_bytes(parts.file_bytes)
            if parts.file_started and fh is None:
                upload_dir.mkdir(parents=True, exist_ok=True)
                fh, parts.upload.path = _open_temp(upload_dir, parts.upload.filename)
            if fh is not None and parts.pending_bytes >= WRITE_BYTES:
                await run_in_threadpool(fh.write, parts.take_pending())
        parser.finalize()
        if not parts.ended:
            raise invalid_multipart("the body ended before the closing boundary")
        if fh is not None and parts.pending:
            await run_in_threadpool(fh.write, parts.take_pending())
    except FormParserError as e:
        raise invalid_multipart(str(e)) from e
    except ClientDisconnect as e:
        # the client is gone: nobody reads the answer, so one line in the log is all it is worth
        log.warning("upload aborted by the client after %d bytes (%s)", seen, _client(request))
        raise APIError(
            400, "The upload was aborted before its end.", param="file", code="upload_aborted"
        ) from e
    finally:
        if fh is not None:
            fh.close()


async def _next_chunk(chunks: AsyncIterator[bytes], timeout: float | None) -> bytes | None:
    """The next piece of the body (None at its end); 408 when none comes within `timeout` s."""
    try:
        with anyio.fail_after(timeout):
            return await anext(chunks)
    except StopAsyncIteration:
        return None
    except TimeoutError as e:
        raise body_timeout(timeout or 0.0) from e


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "unknown client"


@asynccontextmanager
async def received_upload(
    request: Request,
    upload_dir: Path,
    limit: int,
    check_file_bytes: Callable[[int], None] | None = None,
    body_timeout: float | None = None,
) -> AsyncIterator[Upload]:
    """The request's multipart body, its file part in a temporary file in `upload_dir` that is
    removed when the block exits (see the module docstring). `limit` bounds the file's bytes;
    `check_file_bytes(n)` (raising to refuse) sees the file part's size as it grows; `body_timeout`
    bounds the silence between two pieces of the body (None: no bound)."""
    parts = _PartCollector()
    parser = MultipartParser(multipart_boundary(request.headers.get("content-type")), parts.callbacks())
    try:
        await _read_body(request, parser, parts, upload_dir, limit, check_file_bytes, body_timeout)
        yield parts.upload
    finally:
        if parts.upload.path is not None:
            with suppress(OSError):
                parts.upload.path.unlink(missing_ok=True)
