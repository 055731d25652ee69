"""A dead or busy inference worker, told apart and told fast (issue 25, finding 4), with a live API
(uvicorn) and a real inference worker process on an endless tiny checkpoint:

- the worker killed (SIGKILL, by its PID) mid-stream: the stream sends `: keep-alive` comments
  while the worker is silent, then one error event `inference_worker_lost` that names the worker
  the row named, once its heartbeat stopped for inference_lease_seconds (lowered here), not after
  inference_wait + max_inference + grace seconds;
- every worker thread busy: 503 `inference_workers_busy` with Retry-After and a message that says
  so; with no worker at all it stays `no_inference_worker` (tests/api/test_completions_api.py).
Prints the time from the kill to the error (run with -s)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.api.conftest import Factory
from tests.api.test_inference_service import (  # noqa: F401 - a fixture, used below
    endless_checkpoint_tar,
    owner_of,
    rows,
)
from tests.fixtures.service import LiveServer, ServiceProcess, wait_until

ENDLESS = {"prompt": "Hi", "max_tokens": 10_000_000, "temperature": 1.0}


@pytest.mark.service_settings(
    max_completion_tokens=10_000_000,
    inference_heartbeat_seconds=0.5,
    inference_lease_seconds=3,
    sse_keepalive_seconds=0.5,
)
def test_a_killed_worker_is_named_in_the_stream_after_keep_alives(
    live_server: LiveServer,
    inference_worker: ServiceProcess,
    factory: Factory,
    session_factory: Any,
    endless_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    owner = owner_of(live_server, session_factory)
    _, model_id = factory.finished_model(owner, tar_bytes=endless_checkpoint_tar)
    body = {"model": model_id, **ENDLESS, "stream": True}
    with httpx.Client(timeout=120) as client:
        with client.stream(
            "POST", f"{live_server.url}/v1/completions", json=body, headers=live_server.headers()
        ) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            events = 0
            while events < 3:
                events += next(lines).startswith("data: ")
            (running,) = rows(session_factory, owner)
            assert running.status == "running" and running.worker and running.heartbeat_at is not None
            inference_worker.kill()  # SIGKILL by PID: nothing of it runs any more
            killed = time.monotonic()
            keepalives, error = 0, None
            for line in lines:
                keepalives += line == ": keep-alive"
                if line.startswith("data: ") and "error" in (data := json.loads(line[6:])):
                    error = data["error"]
                    break
            lost_after = time.monotonic() - killed
    assert error is not None and error["code"] == "inference_worker_lost", error
    assert running.worker in error["message"], (running.worker, error)
    assert keepalives >= 1
    print(f"\nthe killed worker {running.worker} reported lost {lost_after:.1f} s after the kill")
    wait_until(lambda: not rows(session_factory, owner), message="the API to delete the row")


@pytest.mark.service_settings(
    max_completion_tokens=10_000_000, inference_concurrency=1, inference_wait_seconds=2
)
def test_a_busy_worker_is_busy_not_absent(
    live_server: LiveServer,
    inference_worker: ServiceProcess,
    factory: Factory,
    session_factory: Any,
    endless_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    owner = owner_of(live_server, session_factory)
    _, model_id = factory.finished_model(owner, tar_bytes=endless_checkpoint_tar)
    url = f"{live_server.url}/v1/completions"
    # inference_wait_seconds is short: let the worker start consuming first
    wait_until(lambda: " ready." in inference_worker.output(), message=inference_worker.output)
    with httpx.Client(timeout=120) as client:
        # the worker's one thread generates an endless completion
        with client.stream(
            "POST", url, json={"model": model_id, **ENDLESS, "stream": True}, headers=live_server.headers()
        ) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            while not next(lines).startswith("data: "):
                pass
            busy = client.post(url, json={"model": model_id, **ENDLESS}, headers=live_server.headers())
    assert busy.status_code == 503, busy.text
    err = busy.json()["error"]
    assert err["code"] == "inference_workers_busy", err
    assert "busy" in err["message"] and "inference_wait_seconds" in err["message"]
    assert int(busy.headers["retry-after"]) > 0 and busy.headers["x-should-retry"] == "true"
    assert inference_worker.alive
