"""The playground (views/playground.js) in a real Chromium against the stubbed API, its streamed
answers written one event at a time by a real HTTP server (stub_api.EventStream): the text appears
as it streams and completely, usage is shown, an error's message is shown, Stop hangs up; the mode
follows the model's training data (chat for conversations, completion otherwise) unless chosen."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.dashboard.stub_api import (
    CHAT_DATA,
    DONE,
    TEXT_DATA,
    EventStream,
    StubApi,
    Text,
    chat_chunk,
    completion_chunk,
    error,
    ok,
    sign_in_with_stub,
    stub_file,
    stub_model,
    stub_training_data,
    usage_chunk,
)

FINAL = "ft:llama-tiny:stub:final"
CHECKPOINT = "ft:llama-tiny:stub:ckpt-step-20"
PROSE = "ft:llama-tiny:prose:final"  # trained on plain text, by another job
MODELS = [
    {"id": FINAL, "object": "model", "created": 1_700_000_100, "owned_by": "o", "kind": "fine_tuned",
     "job_id": "ftjob-stub", "step": 40, "root": "llama-tiny", "parent": None},
    {"id": CHECKPOINT, "object": "model", "created": 1_700_000_050, "owned_by": "o", "kind": "checkpoint",
     "job_id": "ftjob-stub", "step": 20, "root": "llama-tiny", "parent": None},
    stub_model(PROSE, "ftjob-prose") | {"created": 1_700_000_010},
]  # fmt: skip
HUNG_UP_WAIT = 20.0  # seconds: a bound for the stub to see the page hang up, not a speed check


@pytest.fixture
def events() -> Iterator[EventStream]:
    stream = EventStream()
    yield stream
    stream.close()


def open_playground(new_page: Any, static_url: str, route: str = "#/playground") -> tuple[Any, Any, StubApi]:
    """The playground on `route`; ftjob-stub's models were trained on conversations, PROSE on text.
    Without a mode in the route, returns once the mode follows the model chosen."""
    page, log = new_page()
    api = StubApi(page)
    api.on("GET", "/models", ok({"object": "list", "data": MODELS, "has_more": False}))
    stub_training_data(api, "ftjob-stub", CHAT_DATA)
    stub_training_data(api, "ftjob-prose", TEXT_DATA, file_id="file-prose")
    sign_in_with_stub(page, static_url, route)
    page.wait_for_selector("#pg-model:enabled")
    if "mode=" not in route:
        page.wait_for_selector(".pg-main[data-mode-for]")
    return page, log, api


def assistant_text(page: Any, n: int = -1) -> str:
    texts: list[str] = page.locator(".msg-assistant .msg-text").all_text_contents()
    return texts[n]


def test_chat_answer_streams_in_piece_by_piece(new_page: Any, static_url: str, events: EventStream) -> None:
    page, log, api = open_playground(new_page, static_url)
    api.stream("POST", "/chat/completions", events)
    assert page.get_by_label("Model or checkpoint").input_value() == FINAL  # the newest model first
    assert page.get_by_role("link", name="Playground").get_attribute("aria-current") == "page"
    page.get_by_label("System prompt").fill("You are terse.")
    page.get_by_label("Max tokens").fill("16")
    page.get_by_label("Seed").fill("7")
    page.get_by_label("Your message").fill("Hello?")
    page.get_by_role("button", name="Send").click()

    page.wait_for_selector(".msg-user .msg-text:text-is('Hello?')")
    assert page.get_by_role("button", name="Stop").is_enabled()
    assert page.get_by_role("button", name="Send").is_disabled()
    events.send(chat_chunk(role=True, content=""), chat_chunk("Good "))
    page.wait_for_function("document.querySelector('.msg-assistant .msg-text').textContent === 'Good '")
    events.send(chat_chunk("morrow,"))
    page.wait_for_function(
        "document.querySelector('.msg-assistant .msg-text').textContent === 'Good morrow,'"
    )
    assert page.locator(".msg-assistant.streaming").count() == 1  # still streaming: nothing more came
    events.send(
        chat_chunk(" sir."), chat_chunk(finish="stop"), usage_chunk("chat.completion.chunk", 11, 4), DONE
    )
    events.end()
    page.wait_for_selector("#pg-stats:has-text('completion tokens')")

    assert assistant_text(page) == "Good morrow, sir."
    assert page.locator(".msg-assistant.streaming").count() == 0
    stats = page.inner_text("#pg-stats")
    assert "11 prompt + 4 completion tokens" in stats and "tokens/s" in stats and "finish: stop" in stats, (
        stats
    )
    assert page.get_by_label("Your message").input_value() == ""
    assert page.get_by_role("button", name="Send").is_enabled()
    assert page.get_by_role("button", name="Stop").is_disabled()
    assert api.sent[-1] == {
        "model": FINAL,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello?"}],
        "max_tokens": 16,
        "temperature": 0.8,
        "top_p": 1,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert f"model={FINAL}" in page.evaluate("decodeURIComponent(location.hash)")

    # the next turn sends the whole conversation (Enter sends)
    page.get_by_label("Your message").fill("And?")
    page.get_by_label("Your message").press("Enter")
    page.wait_for_selector(".msg-user >> nth=1")
    events.send(chat_chunk("Farewell."), DONE)
    events.end()
    page.wait_for_selector(".msg-assistant:not(.streaming) >> nth=1")
    assert assistant_text(page) == "Farewell."
    assert [m["content"] for m in api.sent[-1]["messages"]] == [
        "You are terse.",
        "Hello?",
        "Good morrow, sir.",
        "And?",
    ]
    assert "1 chunk" in page.inner_text("#pg-stats")  # no usage chunk this time: the chunks are counted
    assert log.errors() == [], log.messages


def test_completion_continues_the_prompt(new_page: Any, static_url: str, events: EventStream) -> None:
    page, log, api = open_playground(new_page, static_url, f"#/playground?model={CHECKPOINT}&mode=completion")
    api.stream("POST", "/completions", events)
    assert page.get_by_label("Model or checkpoint").input_value() == CHECKPOINT
    assert page.get_by_role("radio", name="Completion").is_checked()
    assert page.get_by_label("System prompt").is_hidden()
    page.get_by_label("Prompt", exact=True).fill("ROMEO:")
    page.get_by_label("Top-p").fill("0.9")
    page.get_by_label("Frequency penalty").fill("0.5")
    page.get_by_label("Stop sequences").fill("\\n\\n\nJULIET")
    page.get_by_role("button", name="Generate").click()
    output = page.get_by_role("region", name="Output")
    events.send(completion_chunk(" What"))
    page.wait_for_function("document.getElementById('pg-output').textContent === 'ROMEO: What'")
    events.send(completion_chunk(" light", finish="length"), usage_chunk("text_completion", 2, 2), DONE)
    events.end()
    page.wait_for_selector("#pg-stats:has-text('2 prompt + 2 completion tokens')")
    assert output.inner_text() == "ROMEO: What light"
    assert page.inner_text("#pg-output .prompt-echo") == "ROMEO:"
    assert "finish: length" in page.inner_text("#pg-stats")
    sent = api.sent[-1]
    assert sent["prompt"] == "ROMEO:" and sent["model"] == CHECKPOINT and sent["stream"] is True
    assert sent["top_p"] == 0.9 and sent["stop"] == ["\n\n", "JULIET"]
    assert sent["frequency_penalty"] == 0.5 and "presence_penalty" not in sent  # an empty box is left out

    page.get_by_role("button", name="Continue from here").click()
    assert page.get_by_label("Prompt", exact=True).input_value() == "ROMEO: What light"
    assert log.errors() == [], log.messages


def test_an_error_answer_shows_its_message(new_page: Any, static_url: str) -> None:
    page, log, api = open_playground(new_page, static_url)
    message = "temperature must be at most 2 (got 5)"
    api.on("POST", "/chat/completions", error(400, message, "temperature"))
    page.get_by_label("Temperature").fill("5")
    page.get_by_label("Your message").fill("Hi")
    page.get_by_role("button", name="Send").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert alert.inner_text() == message
    assert page.get_by_label("Temperature").get_attribute("aria-invalid") == "true"
    # the turn that failed is taken back, ready to send again
    assert page.locator(".msg").count() == 0
    assert page.get_by_label("Your message").input_value() == "Hi"
    assert page.inner_text("#pg-stats").startswith("Failed")
    assert log.errors(allow=("400 (Bad Request)",)) == [], log.messages


def test_an_error_inside_the_stream_keeps_the_text_so_far(
    new_page: Any, static_url: str, events: EventStream
) -> None:
    page, log, api = open_playground(new_page, static_url)
    api.stream("POST", "/chat/completions", events)
    page.get_by_label("Your message").fill("Hi")
    page.get_by_role("button", name="Send").click()
    events.send(chat_chunk("Half an"))
    error_event = {"error": {"message": "the inference worker went away", "type": "server_error",
                             "param": None, "code": "inference_failed"}}  # fmt: skip
    events.send(error_event)
    page.get_by_role("alert").wait_for()
    assert page.get_by_role("alert").inner_text() == "the inference worker went away (inference_failed)"
    assert assistant_text(page) == "Half an"
    assert page.locator(".msg-assistant .msg-note").inner_text() == "cut short"
    assert events.hung_up.wait(HUNG_UP_WAIT), "the page kept reading a stream it gave up on"
    assert log.errors() == [], log.messages


def test_stop_aborts_the_request(new_page: Any, static_url: str, events: EventStream) -> None:
    page, log, api = open_playground(new_page, static_url)
    api.stream("POST", "/chat/completions", events)
    page.get_by_label("Your message").fill("Tell me a long story")
    page.get_by_role("button", name="Send").click()
    events.send(chat_chunk("Once upon"))
    page.wait_for_function("document.querySelector('.msg-assistant .msg-text').textContent === 'Once upon'")
    assert not events.hung_up.is_set()
    page.get_by_role("button", name="Stop").click()
    assert events.hung_up.wait(HUNG_UP_WAIT), "Stop did not close the connection"
    page.wait_for_selector(".msg-assistant[data-outcome=stopped]")
    assert assistant_text(page) == "Once upon"
    assert page.locator(".msg-assistant .msg-note").inner_text() == "stopped"
    assert page.inner_text("#pg-stats").startswith("Stopped")
    assert page.get_by_role("button", name="Stop").is_disabled()
    assert page.get_by_role("button", name="Send").is_enabled()
    assert page.get_by_role("alert").is_hidden()
    events.send(chat_chunk(" a time"))  # too late: the page no longer reads
    page.get_by_label("Your message").fill("x")  # a round trip through the page before looking again
    assert assistant_text(page) == "Once upon"
    assert log.errors() == [], log.messages


def test_try_it_on_the_job_page_opens_the_playground_with_that_model(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    api = StubApi(page)
    base = "/fine_tuning/jobs/ftjob-stub"
    job = {"id": "ftjob-stub", "object": "fine_tuning.job", "model": "llama-tiny", "status": "succeeded",
           "fine_tuned_model": FINAL, "created_at": 1_700_000_000, "finished_at": 1_700_000_100,
           "progress": {"step": 40, "total_steps": 40}, "training_file": "file-1"}  # fmt: skip
    checkpoint = {"id": "ftckpt-1", "step_number": 20, "fine_tuned_model_checkpoint": CHECKPOINT,
                  "metrics": {}, "created_at": 1_700_000_050}  # fmt: skip
    empty = {"object": "list", "data": [], "has_more": False}
    api.on("GET", base, ok(job))
    api.on("GET", f"{base}/metrics", ok(empty))
    api.on("GET", f"{base}/events", ok(empty))
    api.on("GET", f"{base}/checkpoints", ok({"object": "list", "data": [checkpoint], "has_more": False}))
    api.on("GET", "/models", ok({"object": "list", "data": MODELS, "has_more": False}))
    api.on("GET", f"/models/{FINAL}", ok(MODELS[0]))
    api.on("GET", "/files/file-1", ok(stub_file("file-1", "chats.jsonl")))
    api.on("GET", "/files/file-1/content", lambda query, sent: (206, Text(CHAT_DATA)))
    sign_in_with_stub(page, static_url, "#/jobs/ftjob-stub")
    page.wait_for_selector(f"#gen-model option[value='{CHECKPOINT}']", state="attached")
    page.select_option("#gen-model", CHECKPOINT)
    page.get_by_role("link", name="Try it in the playground").click()
    page.wait_for_selector("#pg-model:enabled")
    assert page.get_by_label("Model or checkpoint").input_value() == CHECKPOINT
    assert re.search(r"#/playground\?model=", page.url)
    page.wait_for_selector(f".pg-main[data-mode-for='{CHECKPOINT}']")
    assert page.get_by_role("radio", name="Chat").is_checked()  # its job trained on conversations
    assert log.errors() == [], log.messages


def test_the_mode_follows_the_models_training_data_until_one_is_chosen(
    new_page: Any, static_url: str
) -> None:
    page, log, api = open_playground(new_page, static_url, f"#/playground?model={PROSE}")
    page.wait_for_selector(f".pg-main[data-mode-for='{PROSE}']")
    assert page.get_by_role("radio", name="Completion").is_checked()  # plain text: completion
    assert page.get_by_label("Prompt", exact=True).is_visible()
    assert "mode=" not in page.evaluate("location.hash")  # a reload lets the data decide again
    page.select_option("#pg-model", FINAL)
    page.wait_for_selector(f".pg-main[data-mode-for='{FINAL}']")
    assert page.get_by_role("radio", name="Chat").is_checked()  # conversations: chat
    assert page.get_by_label("Your message").is_visible()

    page.get_by_role("radio", name="Completion").check()  # the user's choice stays
    page.select_option("#pg-model", PROSE)
    page.select_option("#pg-model", CHECKPOINT)
    assert page.get_by_role("radio", name="Completion").is_checked()
    assert "mode=completion" in page.evaluate("location.hash")
    assert log.errors() == [], log.messages


def test_a_mode_in_the_address_wins(new_page: Any, static_url: str) -> None:
    page, log, api = open_playground(new_page, static_url, f"#/playground?model={PROSE}&mode=chat")
    assert page.get_by_role("radio", name="Chat").is_checked()
    page.select_option("#pg-model", CHECKPOINT)
    assert page.get_by_role("radio", name="Chat").is_checked()
    assert api.calls["GET /files/file-prose/content"] == 0 and api.calls["GET /files/file-1/content"] == 0
    assert log.errors() == [], log.messages
