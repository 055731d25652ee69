"""JSONL records -> Documents (trainer/data/records.py, torch-free): which text the loss covers, OpenAI's
`weight` and content parts accepted, null content and other part types refused with a message naming
the line and the field, at upload (validate_file) as in the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.data.formats import DataError, iter_documents, validate_file
from trainer.data.records import Document, record_to_document

REPO = Path(__file__).resolve().parents[2]


def doc(record: object) -> Document:
    return record_to_document(record, 1)


def test_text_records_train_on_everything() -> None:
    d = doc({"text": "hello"})
    assert d.segments == (("hello", True),) and d.eos_trained


def test_prompt_completion_trains_on_the_completion_and_eos() -> None:
    d = doc({"prompt": "Q: 2+2?\nA:", "completion": " 4\n"})
    assert d.segments == (("Q: 2+2?\nA:", False), (" 4\n", True)) and d.eos_trained
    assert d.text == "Q: 2+2?\nA: 4\n"
    assert doc({"prompt": "", "completion": "x"}).segments == (("x", True),)


def test_chat_trains_on_assistant_turns_and_their_end() -> None:
    d = doc(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Bye!"},
            ]
        }
    )
    # the prompt part (headers included) is one segment, exactly what inference renders before
    # the reply; the reply and its newline are trained, and the EOS after the last reply
    assert d.segments == (
        ("<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n", False),
        ("Hello!\n", True),
        ("<|user|>\nBye\n<|assistant|>\n", False),
        ("Bye!\n", True),
    )
    assert d.eos_trained
    assert d.text == (
        "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!\n<|user|>\nBye\n<|assistant|>\nBye!\n"
    )


def test_chat_ending_with_a_user_message_does_not_train_the_eos() -> None:
    d = doc({"messages": [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "?"}]})
    assert d.segments == (("<|assistant|>\n", False), ("Hi\n", True), ("<|user|>\n?\n", False))
    assert not d.eos_trained


def test_weight_zero_leaves_a_turn_out() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "weight": 0},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d", "weight": 1},
    ]
    d = doc({"messages": messages})
    assert d.segments == (
        ("<|user|>\na\n<|assistant|>\nb\n<|user|>\nc\n<|assistant|>\n", False),
        ("d\n", True),
    )
    assert d.eos_trained
    messages[-1]["weight"] = 0.0  # an integral float is 0 too
    last_out = doc({"messages": messages})
    assert [t for _, t in last_out.segments] == [False] and not last_out.eos_trained
    assert last_out.text == d.text  # weights never change the text


def test_content_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    d = doc({"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": parts}]})
    assert d.text == "<|user|>\nHello\n<|assistant|>\nHello\n"
    assert doc({"messages": [{"role": "assistant", "content": []}]}).segments == (
        ("<|assistant|>\n", False),
        ("\n", True),
    )


def test_the_developer_role_is_the_system_role() -> None:
    """OpenAI's newer name for `system`, rendered as the role a chat prompt has at inference."""
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "x"}]
    assert (
        doc({"messages": messages}).text
        == doc({"messages": [{**messages[0], "role": "system"}, messages[1]]}).text
    )
    assert doc({"messages": messages}).text.startswith("<|system|>\n")


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (
            {"role": "assistant", "content": None},
            "line 1: messages[0].content must be a string or a list of text parts, got null",
        ),
        ({"role": "assistant"}, "line 1: messages[0].content is missing"),
        (
            {"role": "user", "content": 5},
            "messages[0].content must be a string or a list of text parts, got int",
        ),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "line 1: messages[0].content[0].type must be \"text\" (only text parts are supported), got 'image_url'",
        ),
        ({"role": "user", "content": [{"text": "x"}]}, "messages[0].content[0].type is missing"),
        ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0].text is missing"),
        (
            {"role": "user", "content": [{"type": "tool", "text": "x"}]},
            'messages[0].content[0].type must be "text"',
        ),
        ({"role": "user", "content": ["x"]}, "messages[0].content[0] must be an object"),
        (
            {"role": "user", "content": [{"type": "text", "text": None}]},
            "messages[0].content[0].text must be a string",
        ),
        (
            {"role": "user", "content": "x", "weight": 0},
            "messages[0].weight is only allowed on assistant messages",
        ),
        ({"role": "assistant", "content": "x", "weight": 0.5}, "messages[0].weight must be 0 or 1, got 0.5"),
        (
            {"role": "assistant", "content": "x", "weight": True},
            "messages[0].weight must be 0 or 1, got true",
        ),
        ({"role": "assistant", "content": "x", "weight": "1"}, "messages[0].weight must be 0 or 1, got str"),
        ({"role": None, "content": "x"}, "messages[0].role must be a string, got null"),
        ({"content": "x"}, "messages[0].role is missing"),
        # the roles a chat prompt can have (/v1/chat/completions refuses others)
        (
            {"role": "tool", "content": "x"},
            'messages[0].role must be one of "system", "user", "assistant", "developer", got \'tool\'',
        ),
    ],
)
def test_bad_messages_are_refused_naming_line_and_field(tmp_path: Path, message: dict, needle: str) -> None:
    with pytest.raises(DataError) as e:
        doc({"messages": [message]})
    assert needle in e.value.message and e.value.line == 1
    # the upload validator says the same, naming the line in the file
    p = tmp_path / "chat.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "ok"}]})
    p.write_text(f"{good}\n\n{json.dumps({'messages': [message]})}\n")
    with pytest.raises(DataError) as e:
        validate_file(p)
    assert e.value.line == 3 and needle.replace("line 1", "line 3") in e.value.message


def test_iter_documents_reads_content_parts(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    p.write_text(json.dumps({"messages": [{"role": "assistant", "content": parts, "weight": 1}]}) + "\n")
    assert validate_file(p).n_records == 1
    assert list(iter_documents(p)) == ["<|assistant|>\nab\n"]


def test_the_upload_validator_stays_torch_free() -> None:
    code = (
        "import sys, trainer.data.formats, trainer.data.records;"
        "bad = [m for m in ('torch', 'numpy') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
