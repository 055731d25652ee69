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
