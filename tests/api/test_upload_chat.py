"""Chat JSONL at upload (POST /v1/files, validated by the torch-free trainer.data.formats): OpenAI's
`weight` and text parts are accepted; null content, other part types and a bad weight are a 400
naming the line and the field, with nothing stored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Tenant, upload
from tests.api.test_files import _rejected


def _jsonl(*records: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def test_weights_and_text_parts_are_accepted(client: TestClient, tenant: Tenant) -> None:
    body = _jsonl(
        {
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
                },
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", "weight": 0},
                {"role": "user", "content": "Again"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}], "weight": 1},
            ]
        },
        {"prompt": "Q:", "completion": " A"},
    )
    r = upload(client, tenant, body, "chat.jsonl")
    assert r.status_code == 200, r.text
    assert r.json()["format"] == "jsonl"


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (
            {"role": "assistant", "content": None},
            "line 2: messages[1].content must be a string or a list of text parts, got null",
        ),
        (
            {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]},
            'line 2: messages[1].content[0].type must be "text" (only text parts are supported)',
        ),
        (
            {"role": "assistant", "content": "x", "weight": 2},
            "line 2: messages[1].weight must be 0 or 1, got 2",
        ),
        (
            {"role": "user", "content": "x", "weight": 1},
            "line 2: messages[1].weight is only allowed on assistant",
        ),
    ],
)
def test_bad_messages_are_a_400_naming_line_and_field(
    client: TestClient, tenant: Tenant, session_factory: Any, message: dict[str, Any], needle: str
) -> None:
    ok = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    bad = {"messages": [{"role": "user", "content": "hi"}, message]}
    err = _rejected(client, tenant, session_factory, _jsonl(ok, bad), "chat.jsonl")
    assert err["param"] == "file" and err["code"] == "invalid_file"
    assert needle in err["message"], err["message"]


def test_a_job_on_a_chat_file_with_nothing_to_learn_is_refused_at_creation(
    client: TestClient, tenant: Tenant
) -> None:
    """Accepted at upload (train_on_inputs can make it trainable), refused when a job would train
    on nothing, naming the file; with train_on_inputs the same file trains."""
    from tests.api.test_errors import assert_envelope
    from tests.api.test_jobs import create

    chats = [{"messages": [{"role": "user", "content": f"question {i} " * 20}]} for i in range(200)]
    silent = upload(client, tenant, _jsonl(*chats), "no-assistant.jsonl").json()["id"]
    good = upload(client, tenant, _jsonl(*[{"text": "words " * 40}] * 200), "text.jsonl").json()["id"]
    hyper = {"max_steps": 5, "ctx": 64}
    err = assert_envelope(
        create(client, tenant, {"model": "llama-tiny", "training_file": silent, "hyperparameters": hyper}),
        400,
    )
    assert err["param"] == "training_file" and err["code"] == "invalid_training_file"
    assert "nothing for the loss to cover" in err["message"] and "train_on_inputs" in err["message"]
    as_validation = {
        "model": "llama-tiny",
        "training_file": good,
        "validation_file": silent,
        "hyperparameters": hyper,
    }
    assert assert_envelope(create(client, tenant, as_validation), 400)["param"] == "validation_file"
    inputs_too = {**hyper, "train_on_inputs": True}
    body = {"model": "llama-tiny", "training_file": silent, "hyperparameters": inputs_too}
    assert create(client, tenant, body).status_code == 200
