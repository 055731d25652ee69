"""One key's streams are bounded (issue 25 finding 7): past `max_streams_per_key` open job streams a
key gets 429 `too_many_streams` naming the setting, before any stream starts; another key is not
affected; a stream that ends gives its slot back. A real uvicorn serves the streams (infinite SSE
responses need a real server)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.keys import create_key
from tests.api.conftest import SHAKESPEARE
from tests.fixtures.service import LiveServer, wait_until

LIMIT = 2


def queued_job(server: LiveServer, headers: dict[str, str]) -> str:
    """A job no worker takes (this server has none): its stream stays open."""
    with open(SHAKESPEARE, "rb") as fh:
        f = httpx.post(
            f"{server.url}/v1/files",
            headers=headers,
            data={"purpose": "fine-tune"},
            files={"file": ("s.txt", fh, "text/plain")},
            timeout=60,
        )
    f.raise_for_status()
    body = {"model": "llama-tiny", "training_file": f.json()["id"], "hyperparameters": {"max_steps": 5}}
    job = httpx.post(f"{server.url}/v1/fine_tuning/jobs", headers=headers, json=body, timeout=60)
    job.raise_for_status()
    return str(job.json()["id"])


@contextlib.contextmanager
def opened(client: httpx.Client, url: str, headers: dict[str, str]) -> Iterator[httpx.Response]:
    with client.stream("GET", url, headers=headers) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the response
        if r.status_code == 200:
            assert next(lines).startswith("retry:")  # the stream runs
        yield r


@pytest.mark.service_settings(max_streams_per_key=LIMIT)
def test_a_key_past_its_open_streams_gets_429(live_server: LiveServer, session_factory: Any) -> None:
    mine = live_server.headers()
    with session_factory() as s:
        _, other_secret = create_key(s, "other", owner_id=f"owner-{secrets.token_hex(4)}")
        s.commit()
    theirs = {"Authorization": f"Bearer {other_secret}"}
    url = f"{live_server.url}/v1/fine_tuning/jobs/{queued_job(live_server, mine)}/stream"
    other_url = f"{live_server.url}/v1/fine_tuning/jobs/{queued_job(live_server, theirs)}/stream"
    with httpx.Client(timeout=30) as client, contextlib.ExitStack() as streams:
        first = streams.enter_context(opened(client, url, mine))
        second = streams.enter_context(opened(client, url, mine))
        assert first.status_code == second.status_code == 200
        refused = client.get(url, headers=mine, timeout=10)
        assert refused.status_code == 429, refused.text
        err = refused.json()["error"]
        assert err["code"] == "too_many_streams" and "FROMSCRATCH_MAX_STREAMS_PER_KEY=2" in err["message"]
        assert refused.headers["retry-after"]
        with opened(client, other_url, theirs) as other:  # another key has its own slots
            assert other.status_code == 200
        second.close()

        def reopened() -> bool:  # the closed stream's slot comes back once the server sees it gone
            with opened(client, url, mine) as again:
                return again.status_code == 200

        wait_until(reopened, timeout=30, interval=0.5, message=lambda: live_server.process.output())
