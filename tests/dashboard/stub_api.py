"""A stand-in for the API inside the browser (Playwright request routing), for testing the dashboard's
own code against the static files alone: each /v1 path answers from a Python function, and every
request is counted. The statuses, download formats and hyperparameter schema are the real ones
(core.status, core.exports, trainer.config.schema), as the API serves them.

Streamed answers (the completions endpoints) come from an EventStream: a real HTTP server that
writes each Server-Sent Event only when the test releases it, so a test sees what the page shows
between two events, and whether the page hung up."""

from __future__ import annotations

import http.server
import json
import queue
import select
import socket
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from core.exports import served_export_formats
from core.status import status_sets
from trainer.config import schema

# (query parameters, JSON body or None) -> (HTTP status, JSON answer, or Text)
Answer = Callable[[dict[str, str], Any], tuple[int, Any]]


class Text(str):
    """An answer's body as plain text, not JSON (a file's content)."""


def ok(body: Any) -> Answer:
    return lambda query, sent: (200, body)


def error(status: int, message: str, param: str | None = None) -> Answer:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return lambda query, sent: (status, body)


# what POST /fine_tuning/jobs/estimate answers (api/job_estimate.py), for the new-job form's panel
ESTIMATE = {"object": "fine_tuning.job.estimate", "queue": "cpu", "device": "cpu", "parameters": 1234,
            "memory_bytes": 5_000_000, "memory_limit_bytes": 8_000_000_000, "steps": 100, "tokens_per_step": 64,
            "tokens": 6400, "seconds": None, "rate_jobs": 0, "problem": None}  # fmt: skip


class StubApi:
    """Routes the page's /v1 requests to `answers[(method, path)]`; anything else is a 404."""

    def __init__(self, page: Any) -> None:
        self.calls: Counter[str] = Counter()  # "GET /fine_tuning/statuses" -> how many times
        self.sent: list[Any] = []  # the JSON bodies of POSTs, in order
        self.posted: dict[str, list[Any]] = {}  # path -> the JSON bodies POSTed to it, in order
        self.streams: dict[tuple[str, str], EventStream] = {}
        self.answers: dict[tuple[str, str], Answer] = {
            ("GET", "/fine_tuning/statuses"): ok({"object": "fine_tuning.statuses", **status_sets()}),
            ("GET", "/fine_tuning/export_formats"): ok(
                {"object": "fine_tuning.export_formats", **served_export_formats()}
            ),
            ("GET", "/fine_tuning/jobs"): ok({"object": "list", "data": [], "has_more": False}),
            ("GET", "/fine_tuning/hyperparameters"): ok(schema.json_schema()),
            ("POST", "/fine_tuning/jobs/estimate"): ok(ESTIMATE),
        }
        page.route("**/v1/**", self._handle)

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies POSTed to `path`, in order."""
        return self.posted.get(path, [])

    def on(self, method: str, path: str, answer: Answer) -> None:
        self.answers[(method, path)] = answer

    def stream(self, method: str, path: str, events: EventStream) -> None:
        """Answer (method, path) from `events` (a streamed answer, see EventStream)."""
        self.streams[(method, path)] = events

    def _handle(self, route: Any) -> None:
        request = route.request
        url = urlsplit(request.url)
        path = unquote(url.path).removeprefix("/v1")  # model ids are sent %-encoded (ft%3A...)
        key = f"{request.method} {path}"
        self.calls[key] += 1
        body = json.loads(request.post_data) if request.post_data else None
        if body is not None:
            self.sent.append(body)
            self.posted.setdefault(path, []).append(body)
        events = self.streams.get((request.method, path))
        if events is not None:
            # route.fulfill hands the page a whole body at once: the stream comes from a real server
            route.continue_(url=events.url + url.path)
            return
        answer = self.answers.get((request.method, path))
        if answer is None:
            route.fulfill(status=404, json={"error": {"message": f"no stub for {key}"}})
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        status, payload = answer(query, body)
        if isinstance(payload, Text):
            route.fulfill(status=status, body=str(payload), content_type="text/plain; charset=utf-8")
        else:
            route.fulfill(status=status, json=payload)


# ------------------------------------------------------------------------------ streamed answers
DONE = "[DONE]"


def chat_chunk(
    content: str | None = None, *, finish: str | None = None, role: bool = False
) -> dict[str, Any]:
    """A chat.completion.chunk as OpenAI streams it (delta.content)."""
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "ft:stub",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def completion_chunk(text: str, *, finish: str | None = None) -> dict[str, Any]:
    """A text_completion chunk as OpenAI streams it (choices[0].text)."""
    return {
        "id": "cmpl-stub",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": "ft:stub",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(kind: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, the usage."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return {
        "id": "stub",
        "object": kind,
        "created": 1_700_000_000,
        "model": "ft:stub",
        "choices": [],
        "usage": usage,
    }


class EventStream:
    """A real HTTP server (a thread) that answers every request with 200 text/event-stream and writes
    the events the test `send`s, each when it is sent; `end()` closes the answer. `hung_up` is set
    when the client closes the connection before the end (the page's Stop)."""

    def __init__(self) -> None:
        self.pending: queue.Queue[bytes | None] = queue.Queue()
        self.hung_up = threading.Event()
        self.started = threading.Event()  # a request is being answered
        events = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the stdlib's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()  # HTTP/1.0: the answer ends when the connection closes
                events.started.set()
                events.answer(self.wfile, self.connection)

            def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def send(self, *events: dict[str, Any] | str) -> None:
        """Queue `data:` events (a dict as JSON, a string as is: DONE) for the answer being written."""
        for e in events:
            data = e if isinstance(e, str) else json.dumps(e)
            self.pending.put(f"data: {data}\n\n".encode())

    def end(self) -> None:
        self.pending.put(None)

    def answer(self, out: Any, conn: socket.socket) -> None:
        """Write what is sent until end(); stop early when the client hangs up."""
        while True:
            try:
                item = self.pending.get(timeout=0.05)
            except queue.Empty:
                if self._closed_by_peer(conn):
                    self.hung_up.set()
                    return
                continue
            if item is None:
                return
            try:
                out.write(item)
                out.flush()
            except OSError:
                self.hung_up.set()
                return

    @staticmethod
    def _closed_by_peer(conn: socket.socket) -> bool:
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        try:
            return conn.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def close(self) -> None:
        self.pending.put(None)
        self.server.shutdown()
        self.server.server_close()


def sign_in_with_stub(page: Any, static_url: str, route: str = "#/jobs") -> None:
    """Store a key as the sign-in page would, then open `route`."""
    page.goto(static_url + "/")
    page.evaluate("localStorage.setItem('fromscratch.apiKey', 'fsk-test')")
    page.goto(f"{static_url}/{route}")


# ------------------------------------------------------------------------------ jobs and metrics
def job_object(
    job_id: str,
    *,
    status: str = "succeeded",
    model: str = "llama-tiny",
    suffix: str | None = None,
    seed: int = 1,
    step: int = 0,
    total_steps: int | None = None,
    train: dict[str, Any] | None = None,
    architecture: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A fine_tuning.job as the API serves it (the fields the dashboard reads); `train` and
    `architecture` are its resolved configs (job.config.train / job.config.model)."""
    return {
        "id": job_id,
        "object": "fine_tuning.job",
        "created_at": 1_700_000_000,
        "finished_at": 1_700_000_600 if status == "succeeded" else None,
        "model": model,
        "fine_tuned_model": None,
        "organization_id": "org-stub",
        "status": status,
        "hyperparameters": {},
        "training_file": "file-1",
        "validation_file": None,
        "result_files": [],
        "trained_tokens": None,
        "error": None,
        "seed": seed,
        "suffix": suffix,
        "estimated_finish": None,
        "integrations": None,
        "metadata": None,
        "method": {"type": "supervised", "supervised": {"hyperparameters": {}}},
        "progress": {"step": step, "total_steps": total_steps, "train_loss": None, "val_loss": None,
                     "tokens_per_s": None, "eta_seconds": None},
        "config": {"model": architecture or {}, "train": train or {}},
        "queue": "default",
        "attempts": 1,
        "started_at": 1_700_000_001,
        "base_model": None,
        "pause_requested": False,
    }  # fmt: skip


def stub_file(file_id: str, filename: str = "data.txt", n_bytes: int = 100_000) -> dict[str, Any]:
    """A file object as GET /v1/files/{id} answers it."""
    return {"id": file_id, "object": "file", "bytes": n_bytes, "created_at": 1_700_000_000,
            "filename": filename, "purpose": "fine-tune", "format": "text", "sha256": "0" * 64}  # fmt: skip


def stub_model(model_id: str, job_id: str, *, kind: str = "fine_tuned", step: int = 40) -> dict[str, Any]:
    """A model object as GET /v1/models lists it."""
    return {"id": model_id, "object": "model", "created": 1_700_000_100, "owned_by": "org-stub", "kind": kind,
            "job_id": job_id, "step": step, "root": "llama-tiny", "parent": None}  # fmt: skip


def metrics_page(points: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """GET /fine_tuning/jobs/{id}/metrics over `points` (step order): after_step and limit as the API
    reads them; max_points is ignored (the stubs' jobs are short)."""
    after = int(query.get("after_step", -(2**62)))
    window = [p for p in points if p["step"] > after]
    if "limit" in query:
        limit = int(query["limit"])
    else:  # 1000 by default, unbounded with max_points
        limit = len(window) if "max_points" in query else 1000
    return {"object": "list", "data": window[:limit], "has_more": len(window) > limit}


class StubJobs:
    """Jobs with their metrics behind a StubApi: GET /fine_tuning/jobs (newest first),
    /fine_tuning/jobs/{id}, /fine_tuning/jobs/{id}/metrics and .../events (`events`, newest first;
    none unless given). A test may change a job or its points between requests (a live run)."""

    def __init__(self, api: StubApi) -> None:
        self.api = api
        self.jobs: dict[str, dict[str, Any]] = {}
        self.points: dict[str, list[dict[str, Any]]] = {}
        api.on("GET", "/fine_tuning/jobs", lambda query, sent: (200, self.listing()))

    def add(
        self, job: dict[str, Any], points: list[dict[str, Any]], events: list[dict[str, Any]] | None = None
    ) -> None:
        job_id = job["id"]
        self.jobs[job_id] = job
        self.points[job_id] = points
        listed = {"object": "list", "data": events or [], "has_more": False}
        self.api.on("GET", f"/fine_tuning/jobs/{job_id}/events", ok(listed))
        self.api.on("GET", f"/fine_tuning/jobs/{job_id}", lambda query, sent: (200, self.jobs[job_id]))
        for file_id in filter(None, (job.get("training_file"), job.get("validation_file"))):
            self.api.on("GET", f"/files/{file_id}", ok(stub_file(file_id)))
        if job.get("fine_tuned_model"):  # the job page asks whether its model still exists
            model_id = job["fine_tuned_model"]
            self.api.on("GET", f"/models/{model_id}", ok(stub_model(model_id, job_id)))
        self.api.on(
            "GET",
            f"/fine_tuning/jobs/{job_id}/metrics",
            lambda query, sent: (200, metrics_page(self.points[job_id], query)),
        )

    def listing(self) -> dict[str, Any]:
        return {"object": "list", "data": list(reversed(self.jobs.values())), "has_more": False}


CHAT_DATA = '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n'
TEXT_DATA = "ROMEO: But soft, what light through yonder window breaks?\n"


def stub_training_data(api: StubApi, job_id: str, content: str, file_id: str = "file-1") -> None:
    """Job `job_id` (GET /fine_tuning/jobs/{id}) trained on file `file_id` holding `content` (GET
    /files/{id}/content, answered 206 as to the playground's Range request): what the playground
    reads to choose a model's mode."""
    job = job_object(job_id)
    job["training_file"] = file_id
    api.on("GET", f"/fine_tuning/jobs/{job_id}", ok(job))
    api.on("GET", f"/files/{file_id}/content", lambda query, sent: (206, Text(content)))
