"""Bounded request heads (issue 25, finding 1), on the server production runs: docker-compose.yml's
api command (the Dockerfile's CMD, tests/test_compose.py) as a throwaway process on a loopback port.

A 100 MB header used to be buffered whole (uvicorn + httptools: 200 after 21 s, `/healthz` stalled
for 16 s, +114 MB RSS; bench/header_flood.py prints the figures). Now it is a 431 before the server
reads past its bound, and `/healthz` on another connection is answered throughout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.head_flood import Poller, api_server_cmd, flood
from tests.fixtures.service import free_port

HEADER_BYTES = 100 * 1000 * 1000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    yield from _serve(tmp_path, {})


@pytest.fixture
def impatient_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A server that waits one second for a request head or a JSON body."""
    yield from _serve(tmp_path, {"FROMSCRATCH_REQUEST_READ_TIMEOUT_SECONDS": "1"})


def _serve(tmp_path: Path, settings: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env["FROMSCRATCH_DATA_DIR"] = str(tmp_path / "data")
    env.update(settings)
    log = open(tmp_path / "api.log", "wb")
    process = subprocess.Popen(api_server_cmd(port, sys.executable), env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "api.log").read_text()
            time.sleep(0.2)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_a_100_mb_header_is_refused_while_healthz_answers(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, process = server
    port = int(url.rsplit(":", 1)[1])
    with Poller(f"{url}/healthz", process.pid) as poller:
        poller.wait_for(1)
        result = flood(port, HEADER_BYTES)
        poller.wait_for(len(poller.latencies) + 2)  # answered after the flood as well
    assert result.status == 431, result
    # the server stopped reading: the rest of the 100 MB never got in
    assert result.cut_off and result.sent < HEADER_BYTES, result
    assert poller.latencies and not poller.failures, poller.failures
    print(
        f"\n100 MB header: {result.status} after {result.seconds:.2f} s, {result.sent / 1e6:.1f} MB taken; "
        f"/healthz max {max(poller.latencies) * 1000:.0f} ms over {len(poller.latencies)} polls; "
        f"RSS {min(poller.rss_kib) / 1024:.0f}-{max(poller.rss_kib) / 1024:.0f} MB"
    )
    assert httpx.get(f"{url}/healthz").status_code == 200


def _raw(port: int, head: bytes) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of one raw request head (the connection is closed after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head_part, _, body = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), body, headers


@pytest.mark.parametrize(
    ("extra", "status", "says"),
    [
        ("".join(f"X-H{i}: v\r\n" for i in range(101)), 431, "FROMSCRATCH_MAX_REQUEST_HEADERS"),
        (f"X-Long: {'a' * 9000}\r\n", 431, "FROMSCRATCH_MAX_REQUEST_LINE_BYTES"),
        ("".join(f"X-H{i}: {'a' * 4000}\r\n" for i in range(9)), 431, "FROMSCRATCH_MAX_REQUEST_HEAD_BYTES"),
    ],
    ids=["count", "line", "total"],
)
def test_each_bound_is_a_431_in_the_error_envelope(
    server: tuple[str, subprocess.Popen[bytes]], extra: str, status: int, says: str
) -> None:
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    # a body announced but never sent: the answer comes from the head alone
    head = f"POST /v1/files HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: 1000000\r\n\r\n".encode()
    got, body, headers = _raw(port, head)
    assert got == status
    assert headers["x-should-retry"] == "false" and headers["connection"] == "close"
    error = httpx.Response(200, content=body).json()["error"]
    assert says in error["message"] and error["code"] == "request_head_too_large"


def test_a_long_url_is_a_414_and_ordinary_heads_pass(server: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    got, body, _ = _raw(port, f"GET /healthz?{'q' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert got == 414 and b"url_too_long" in body
    ordinary = {f"x-h{i}": "v" * 100 for i in range(90)}
    assert httpx.get(f"{url}/healthz", headers=ordinary).status_code == 200


@pytest.mark.parametrize(
    "request_part",
    [
        b"GET /v1/files HTTP/1.1\r\nHost: x\r\n",  # the head never ends
        b"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"model"',  # nor the JSON body
    ],
    ids=["head", "json-body"],
)
def test_a_request_that_trickles_in_is_a_408(
    impatient_server: tuple[str, subprocess.Popen[bytes]], request_part: bytes
) -> None:
    """A client that sends part of a request and waits holds no connection past the setting."""
    url, _ = impatient_server
    got, body, headers = _raw(int(url.rsplit(":", 1)[1]), request_part)
    assert got == 408 and headers["connection"] == "close", body
    error = httpx.Response(200, content=body).json()["error"]
    assert (
        error["code"] == "request_timeout" and "FROMSCRATCH_REQUEST_READ_TIMEOUT_SECONDS" in error["message"]
    )
    assert httpx.get(f"{url}/healthz").status_code == 200  # an ordinary request is not hurried
