"""A small HTTP client for the fromscratch public API (what the `fromscratch files|jobs|models`
commands use). It wraps httpx with the Bearer header, turns the `{"error": {...}}` envelope into
`APIError`, streams uploads and downloads, and reads the job's Server-Sent Events (with httpx-sse).

Only the public /v1 API is used, so anything this client does a script can do with curl.
"""

from __future__ import annotations

import json
import mimetypes
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx
from httpx_sse import EventSource, ServerSentEvent

DEFAULT_SERVER = "http://127.0.0.1:8000"
UPLOAD_CHUNK = 1 << 20  # 1 MiB: the body is streamed, never read whole
DEFAULT_EXPORT_WAIT = 600.0  # seconds a download waits for a worker to prepare its export

ProgressFn = Callable[[int], None]  # called with the number of bytes just sent/received


class APIError(Exception):
    """An error answered by the server (its error envelope) or a failure to reach it."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code

    def one_line(self) -> str:
        """The error as one line for a terminal: message, then the field at fault and the status."""
        extras = []
        if self.param:
            extras.append(f"param: {self.param}")
        if self.code:
            extras.append(f"code: {self.code}")
        if self.status_code is not None:
            extras.append(f"HTTP {self.status_code}")
        return self.message + (f" ({', '.join(extras)})" if extras else "")

    @classmethod
    def from_response(cls, response: httpx.Response) -> APIError:
        """Build from an error response: the documented envelope, or whatever else came back."""
        status = response.status_code
        try:
            body = json.loads(response.read() or b"null")
        except (ValueError, httpx.HTTPError):
            body = None
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return cls(
                str(err["message"]),
                status_code=status,
                type=err.get("type"),
                param=err.get("param"),
                code=err.get("code"),
            )
        if isinstance(body, dict) and "detail" in body:  # a bare FastAPI error slipped through
            return cls(str(body["detail"]), status_code=status)
        reason = response.reason_phrase or "error"
        hint = " (is the API key right? set --api-key or FROMSCRATCH_API_KEY)" if status == 401 else ""
        return cls(f"server answered {status} {reason}{hint}", status_code=status)


def _multipart_body(
    fh: BinaryIO, filename: str, size: int, fields: dict[str, str], progress: ProgressFn | None
) -> tuple[str, int, Iterator[bytes]]:
    """A streamed multipart/form-data body: (content type, exact length, chunks). The file is read
    UPLOAD_CHUNK bytes at a time, so a 1 GiB upload never sits in memory."""
    boundary = "fromscratch-" + secrets.token_hex(16)
    head = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    )
    safe_name = filename.replace('"', "%22").replace("\r", "").replace("\n", "")
    ctype = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    head += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{safe_name}"\r\n'
        f"Content-Type: {ctype}\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def chunks() -> Iterator[bytes]:
        yield head
        while True:
            chunk = fh.read(UPLOAD_CHUNK)
            if not chunk:
                break
            yield chunk
            if progress:
                progress(len(chunk))
        yield tail

    return f"multipart/form-data; boundary={boundary}", len(head) + size + len(tail), chunks()


class Client:
    """The public API as methods. Every method raises APIError for an error answer or a server
    that cannot be reached; list methods return the decoded `{object: "list", ...}` envelope."""

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.server,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------
    def _send(
        self, method: str, path: str, *, stream: bool = False, follow_redirects: bool = False, **kwargs: Any
    ) -> httpx.Response:
        try:
            request = self._http.build_request(method, path, **kwargs)
            response = self._http.send(request, stream=stream, follow_redirects=follow_redirects)
        except httpx.TimeoutException as e:
            raise APIError(f"timed out talking to {self.server}: {e}") from e
        except httpx.HTTPError as e:
            raise APIError(f"cannot reach the server at {self.server}: {e}") from e
        if response.status_code >= 400:
            try:
                raise APIError.from_response(response)
            finally:
                response.close()
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as e:
            raise APIError(
                f"the server sent something that is not JSON for {method} {path}",
                status_code=response.status_code,
            ) from e

    # -- files ----------------------------------------------------------------------------
    def upload_file(
        self, path: str | os.PathLike[str], purpose: str = "fine-tune", progress: ProgressFn | None = None
    ) -> dict[str, Any]:
        path = Path(path)
        size = path.stat().st_size
        with path.open("rb") as fh:
            ctype, length, body = _multipart_body(fh, path.name, size, {"purpose": purpose}, progress)
            # Uploads of large files take a while: no read timeout while the server digests it.
            return self.request(
                "POST",
                "/v1/files",
                content=body,
                headers={"Content-Type": ctype, "Content-Length": str(length)},
                timeout=httpx.Timeout(None, connect=10.0),
            )

    def list_files(self) -> dict[str, Any]:
        return self.request("GET", "/v1/files")

    def get_file(self, file_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/files/{file_id}")

    def delete_file(self, file_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/files/{file_id}")

    # -- jobs -----------------------------------------------------------------------------
    def create_job(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", "/v1/fine_tuning/jobs", json=body, headers=headers)

    def list_jobs(
        self,
        after: str | None = None,
        limit: int | None = None,
        status: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A page of jobs, newest first; `status` and `metadata` (every pair) filter them."""
        given = {"after": after, "limit": limit, "status": status}
        params: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        params |= {f"metadata[{k}]": v for k, v in (metadata or {}).items()}
        return self.request("GET", "/v1/fine_tuning/jobs", params=params)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/fine_tuning/jobs/{job_id}")

    def job_action(self, job_id: str, action: str) -> dict[str, Any]:
        if action not in ("cancel", "pause", "resume"):
            raise ValueError(f"unknown job action {action!r}")
        return self.request("POST", f"/v1/fine_tuning/jobs/{job_id}/{action}")

    def metrics(
        self,
        job_id: str,
        after_step: int | None = None,
        limit: int | None = None,
        max_points: int | None = None,
    ) -> dict[str, Any]:
        params = {
            k: v
            for k, v in {"after_step": after_step, "limit": limit, "max_points": max_points}.items()
            if v is not None
        }
        return self.request("GET", f"/v1/fine_tuning/jobs/{job_id}/metrics", params=params)

    def events(self, job_id: str, limit: int | None = None) -> dict[str, Any]:
        params = {"limit": limit} if limit else {}
        return self.request("GET", f"/v1/fine_tuning/jobs/{job_id}/events", params=params)

    def checkpoints(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/fine_tuning/jobs/{job_id}/checkpoints")

    def stream(
        self, job_id: str, last_event_id: str | None = None, read_timeout: float = 60.0
    ) -> Iterator[ServerSentEvent]:
        """Yield the job's SSE events until the server closes the stream. An event's `id` is the
        stream's last event id so far (what a reconnect sends as Last-Event-ID). A gap longer than
        `read_timeout` with not even a keep-alive comment raises APIError (the caller reconnects
        with the last event id it saw)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        response = self._send(
            "GET",
            f"/v1/fine_tuning/jobs/{job_id}/stream",
            stream=True,
            headers=headers,
            timeout=httpx.Timeout(read_timeout, connect=10.0),
        )
        yield from _events(response, "the event stream")

    # -- models ---------------------------------------------------------------------------
    def list_models(self) -> dict[str, Any]:
        return self.request("GET", "/v1/models")

    def get_model(self, model_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/models/{model_id}")

    def delete_model(self, model_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/models/{model_id}")

    def stream_completion(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST `body` with `stream: true` to /v1/completions or /v1/chat/completions (`path`) and
        yield its chunks (OpenAI's shapes) until `[DONE]`."""
        response = self._send(
            "POST",
            path,
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
            stream=True,
            timeout=httpx.Timeout(300.0, connect=10.0),
        )
        for event in _events(response, "the completion stream"):
            if event.data == "[DONE]":
                return
            yield json.loads(event.data)

    def download_model(
        self,
        model_id: str,
        fmt: str,
        write: Callable[[bytes], object],
        on_start: Callable[[int | None, str | None], None] | None = None,
        progress: ProgressFn | None = None,
        *,
        dtype: str | None = None,
        wait: float = DEFAULT_EXPORT_WAIT,
        on_preparing: Callable[[float], None] | None = None,
    ) -> None:
        """Stream `GET /v1/models/{id}/content?format=fmt[&dtype=]` into `write`. `on_start(total,
        filename)` gets the Content-Length (None if absent) and the Content-Disposition filename first.

        An export not made yet answers 202 while a worker prepares it: this asks again after each
        `Retry-After` for at most `wait` seconds (then APIError), calling `on_preparing(seconds
        waited)` about once a second meanwhile."""
        params = {"format": fmt, **({"dtype": dtype} if dtype else {})}
        started = time.monotonic()
        while True:
            response = self._send(
                "GET",
                f"/v1/models/{model_id}/content",
                params=params,
                stream=True,
                # a server storing models in S3 may redirect to a presigned URL (httpx drops the
                # Authorization header when the redirect leaves the API's origin)
                follow_redirects=True,
                timeout=httpx.Timeout(600.0, connect=10.0),
            )
            if response.status_code != 202:
                break
            retry_after = _retry_after(response.headers.get("retry-after"))
            response.close()
            self._wait_for_export(started, wait, retry_after, f"the {fmt} export of {model_id}", on_preparing)
        try:
            length = response.headers.get("content-length")
            if on_start:
                on_start(
                    int(length) if length and length.isdigit() else None,
                    content_disposition_filename(response.headers.get("content-disposition")),
                )
            for chunk in response.iter_bytes(UPLOAD_CHUNK):
                write(chunk)
                if progress:
                    progress(len(chunk))
        except httpx.HTTPError as e:
            raise APIError(f"the download of {model_id} broke off: {e}") from e
        finally:
            response.close()

    @staticmethod
    def _wait_for_export(
        started: float, wait: float, delay: float, what: str, on_preparing: Callable[[float], None] | None
    ) -> None:
        """Sleep `delay` seconds (ticking on_preparing each second), or fail past `wait` in all."""
        waited = time.monotonic() - started
        if waited + delay > wait:
            raise APIError(
                f"{what} is still being prepared after {waited:.0f} s, and the next check would pass the "
                f"wait limit of {wait:g} s: try again later, or wait longer (--wait)",
                status_code=202,
            )
        end = time.monotonic() + delay
        while (left := end - time.monotonic()) > 0:
            if on_preparing:
                on_preparing(time.monotonic() - started)
            time.sleep(min(1.0, left))


def _events(response: httpx.Response, what: str) -> Iterator[ServerSentEvent]:
    """The Server-Sent Events of a streamed `response` that carry data, until it ends (or the
    consumer stops: the response is closed either way); a stream that breaks off is an APIError."""
    try:
        for event in EventSource(response).iter_sse():
            # httpx-sse also dispatches blocks with no data (a bare `retry:`, or a keep-alive
            # once an id was seen); the SSE spec dispatches no event for those.
            if event.data:
                yield event
    except httpx.HTTPError as e:  # includes httpx_sse.SSEError (not an event stream)
        raise APIError(f"{what} dropped: {e}") from e
    finally:
        response.close()


def _retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header (delta-seconds), bounded to [0.5, 60]; 2 when absent."""
    try:
        seconds = float(value) if value else 2.0
    except ValueError:
        seconds = 2.0
    return min(max(seconds, 0.5), 60.0)


def content_disposition_filename(header: str | None) -> str | None:
    """The filename from a Content-Disposition header (plain `filename=` form), made safe to
    use as a bare file name."""
    if not header:
        return None
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name.lower() == "filename" and value:
            value = value.strip().strip('"')
            value = os.path.basename(value.replace("\\", "/"))
            return value if value not in ("", ".", "..") else None
    return None
