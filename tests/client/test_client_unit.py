"""client.http without a server: the SSE stream (read with httpx-sse), the streamed multipart body,
error envelopes, Content-Disposition names; and the CLI's hyperparameter options generated from
trainer.config."""

from __future__ import annotations

import argparse
import io
from typing import Any

import httpx
import pytest
from python_multipart.multipart import MultipartParser, parse_options_header  # FastAPI's own parser

from client.commands import register
from client.http import APIError, Client, _multipart_body, content_disposition_filename
from client.hyperparameter_options import hyperparameters_from_args


def stream_events(chunks: list[bytes], last_event_id: str | None = None) -> tuple[list[Any], httpx.Request]:
    """Client.stream over a fake server that sends the body in these chunks; the events and the
    request the client made."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(chunks))

    with Client("http://x", "fsk-test", transport=httpx.MockTransport(handler)) as client:
        events = list(client.stream("job-1", last_event_id))
    return events, seen[0]


def test_sse_stream_handles_split_chunks_crlf_comments_and_multiline_data() -> None:
    text = (
        b'retry: 2000\r\n\r\n: keep-alive\r\n\r\nevent: metrics\r\nid: 3.0\r\ndata: {"step": 3}\r\n\r\n'
        b": keep-alive\n\nevent: status\nid: 3.1\ndata: line one\ndata: line two\n\ndata: plain\n\n"
    )
    # every split position must give the same events (chunk boundaries fall anywhere, CRLF included)
    expected = None
    for cut in range(1, len(text)):
        events, _ = stream_events([text[:cut], text[cut:]])
        got = [(e.event, e.data, e.id) for e in events]
        if expected is None:
            expected = got
        assert got == expected, f"split at {cut}"
    # an event without an id carries the last one (the id a reconnect sends as Last-Event-ID)
    assert expected == [
        ("metrics", '{"step": 3}', "3.0"),
        ("status", "line one\nline two", "3.1"),
        ("message", "plain", "3.1"),
    ]


def test_sse_stream_keeps_an_incomplete_event_until_its_blank_line() -> None:
    [event], _ = stream_events([b'event: metrics\ndata: {"step": 1}\n', b"\n"])
    assert event.json() == {"step": 1}
    unfinished, _ = stream_events([b'event: metrics\ndata: {"step": 1}\n'])
    assert unfinished == []


def test_sse_stream_sends_the_last_event_id_when_reconnecting() -> None:
    _, request = stream_events([b""], last_event_id="7.2")
    assert request.headers["Last-Event-ID"] == "7.2"
    assert request.headers["Accept"] == "text/event-stream"
    assert request.url.path == "/v1/fine_tuning/jobs/job-1/stream"
    _, first = stream_events([b""])
    assert "Last-Event-ID" not in first.headers


def test_a_response_that_is_not_an_event_stream_is_an_api_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html></html>")

    with Client("http://x", "fsk-test", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(APIError, match="event stream"):
            list(client.stream("job-1"))


def test_multipart_body_is_streamed_in_chunks_and_parses_as_form_data() -> None:

    payload = bytes(range(256)) * 9000  # 2.3 MB, binary-safe, several chunks
    sent: list[int] = []
    ctype, length, body = _multipart_body(
        io.BytesIO(payload), 'we"ird.txt', len(payload), {"purpose": "fine-tune"}, sent.append
    )
    chunks = list(body)
    assert len(chunks) > 3 and max(len(c) for c in chunks) <= 1 << 20  # never the whole file at once
    raw = b"".join(chunks)
    assert len(raw) == length
    assert sum(sent) == len(payload)

    parts: dict[str, bytes] = {}
    headers: dict[str, str] = {}
    current: dict[str, Any] = {}

    def on_part_begin() -> None:
        current.clear()
        current["data"] = b""

    def on_header_field(data: bytes, start: int, end: int) -> None:
        current["field"] = data[start:end].decode()

    def on_header_value(data: bytes, start: int, end: int) -> None:
        headers[current["field"].lower()] = data[start:end].decode()
        if current["field"].lower() == "content-disposition":
            _, opts = parse_options_header(data[start:end])
            current["name"] = opts[b"name"].decode()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        current["data"] += data[start:end]

    def on_part_end() -> None:
        parts[current["name"]] = current["data"]

    _, opts = parse_options_header(ctype)
    parser = MultipartParser(
        opts[b"boundary"],
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    parser.write(raw)
    parser.finalize()
    assert parts == {"purpose": b"fine-tune", "file": payload}
    assert '"we%22ird.txt"' in headers["content-disposition"]


def response(status: int, **kwargs: Any) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "http://x/v1/y"), **kwargs)


def test_api_error_reads_the_envelope_and_formats_one_line() -> None:
    err = APIError.from_response(
        response(
            400,
            json={
                "error": {
                    "message": "n_embd (65) must be divisible by n_head (4)",
                    "type": "invalid_request_error",
                    "param": "n_embd",
                    "code": "invalid_hyperparameter",
                }
            },
        )
    )
    assert (err.status_code, err.param, err.code) == (400, "n_embd", "invalid_hyperparameter")
    line = err.one_line()
    assert "\n" not in line
    assert line.startswith("n_embd (65) must be divisible") and "param: n_embd" in line and "HTTP 400" in line


def test_api_error_survives_bodies_that_are_not_the_envelope() -> None:
    html = APIError.from_response(response(502, text="<html>bad gateway</html>"))
    assert html.status_code == 502 and "502" in html.one_line()
    detail = APIError.from_response(response(404, json={"detail": "Not Found"}))
    assert detail.message == "Not Found"
    unauthorized = APIError.from_response(response(401, content=b""))
    assert "API key" in unauthorized.message


@pytest.mark.parametrize(
    "header,name",
    [
        ('attachment; filename="ft_llama-tiny_ab12.gguf"', "ft_llama-tiny_ab12.gguf"),
        ("attachment; filename=model.onnx", "model.onnx"),
        ('attachment; filename="../../etc/passwd"', "passwd"),
        ('attachment; filename=".."', None),
        (None, None),
    ],
)
def test_content_disposition_filename_is_a_bare_safe_name(header: str | None, name: str | None) -> None:
    assert content_disposition_filename(header) == name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fromscratch")
    register(parser.add_subparsers(dest="command"))
    return parser


def test_jobs_create_sends_only_the_options_given() -> None:
    args = _parser().parse_args(
        [
            "jobs",
            "create",
            "--file",
            "file-1",
            "--max-steps",
            "60",
            "--learning-rate",
            "3e-4",
            "--n-epochs",
            "auto",
            "--tie-embeddings",
            "--schedule",
            "constant",
        ]
    )
    assert hyperparameters_from_args(args) == {
        "max_steps": 60,
        "learning_rate": 3e-4,
        "n_epochs": "auto",
        "tie_embeddings": True,
        "schedule": "constant",
    }
    bare = _parser().parse_args(["jobs", "create", "--file", "file-1"])
    assert hyperparameters_from_args(bare) == {}


def test_bad_option_values_are_usage_errors() -> None:
    for argv in (
        ["jobs", "create", "--file", "f", "--max-steps", "ten"],
        ["jobs", "create", "--file", "f", "--tokenizer", "words"],
        ["models", "download", "m", "--format", "zip"],
        ["jobs", "create"],
    ):
        with pytest.raises(SystemExit) as exc:
            _parser().parse_args(argv)
        assert exc.value.code == 2, argv
