"""Generate on the job page (issue 24 part 6) in a real Chromium against the stubbed API: the text
streams in piece by piece as the playground's does (POST /v1/completions, stream: true, written one
event at a time by stub_api.EventStream), with the playground's controls (top-p, temperature, seed,
stop) and its run line; Stop hangs up."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.dashboard.stub_api import (
    DONE,
    EventStream,
    StubApi,
    StubJobs,
    completion_chunk,
    job_object,
    ok,
    sign_in_with_stub,
    usage_chunk,
)

JOB_ID = "ftjob-gen"
MODEL = "ft:llama-tiny:stub:final"
EMPTY = {"object": "list", "data": [], "has_more": False}


@pytest.fixture
def events() -> Iterator[EventStream]:
    stream = EventStream()
    yield stream
    stream.close()


def open_job(new_page: Any, static_url: str, events: EventStream) -> tuple[Any, Any, StubApi]:
    page, log = new_page()
    api = StubApi(page)
    job = job_object(JOB_ID)
    job["fine_tuned_model"] = MODEL
    StubJobs(api).add(job, [])
    for path in ("checkpoints", "events"):
        api.on("GET", f"/fine_tuning/jobs/{JOB_ID}/{path}", ok(EMPTY))
    api.stream("POST", "/completions", events)
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector(f"#gen-model option[value='{MODEL}']", state="attached")
    return page, log, api


def test_generate_streams_with_the_playgrounds_controls(
    new_page: Any, static_url: str, events: EventStream
) -> None:
    page, log, api = open_job(new_page, static_url, events)
    # the playground's controls, not top-k
    for control in ("#gen-max-tokens", "#gen-temperature", "#gen-top-p", "#gen-seed", "#gen-stop"):
        assert page.locator(control).count() == 1, control
    assert page.locator("#gen-top-k").count() == 0
    page.fill("#gen-prompt", "ROMEO:")
    page.fill("#gen-max-tokens", "40")
    page.fill("#gen-top-p", "0.9")
    page.fill("#gen-temperature", "0.7")
    page.fill("#gen-seed", "3")
    page.click("button:has-text('Generate')")
    events.send(completion_chunk(" What"))
    page.wait_for_function("document.getElementById('gen-output').textContent === 'ROMEO: What'")
    assert page.is_enabled("#gen-stop-button")  # still streaming: nothing more came
    events.send(completion_chunk(" light", finish="length"), usage_chunk("text_completion", 2, 2), DONE)
    events.end()
    page.wait_for_selector("#gen-stats:has-text('2 prompt + 2 completion tokens')")
    assert page.inner_text("#gen-output") == "ROMEO: What light"
    assert page.is_disabled("#gen-stop-button") and page.is_enabled("button:has-text('Generate')")
    sent = api.bodies("/completions")[-1]
    assert sent == {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 40, "temperature": 0.7, "top_p": 0.9,
                    "seed": 3, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    assert log.errors() == [], log.messages


def test_stop_hangs_up(new_page: Any, static_url: str, events: EventStream) -> None:
    page, log, _ = open_job(new_page, static_url, events)
    page.fill("#gen-prompt", "ROMEO:")
    page.click("button:has-text('Generate')")
    events.send(completion_chunk(" What"))
    page.wait_for_function("document.getElementById('gen-output').textContent === 'ROMEO: What'")
    page.click("#gen-stop-button")
    assert events.hung_up.wait(20.0)  # a bound for the stub to see the page hang up, not a speed check
    page.wait_for_selector("#gen-stats:has-text('Stopped')")
    assert page.get_attribute("#gen-output", "data-outcome") == "stopped"
    assert log.errors() == [], log.messages
