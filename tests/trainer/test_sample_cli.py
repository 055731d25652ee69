"""`fromscratch sample` (trainer/sample_cli.py): the text streamed as it is generated is the sampler's
own, a stop sequence cuts it, and `--chat` replies in the service's chat format with the conversation
so far as each reply's context."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

from cli.main import main
from tests.trainer.test_cli import TINY
from trainer.checkpoint import load_model
from trainer.config import ModelConfig
from trainer.data.chat import CHAT_STOP, chat_prompt
from trainer.data.tokenizers import ByteTokenizer
from trainer.model.llama import Llama
from trainer.sample_cli import chat, stream_text
from trainer.sampling import Penalties, generate, stream_ids

GREEDY = dict(max_new_tokens=24, temperature=0.0)
GREEDY_12 = dict(max_new_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def model() -> Llama:
    torch.manual_seed(3)
    return Llama(
        ModelConfig(n_layer=1, n_head=2, n_embd=32, ctx=64, vocab_size=ByteTokenizer().vocab_size)
    ).eval()


def _cut(text: str, stop: str) -> str:
    return text[: text.index(stop)] if stop in text else text


def test_streamed_text_is_the_samplers_and_a_stop_cuts_it(model: Llama) -> None:
    tok = ByteTokenizer()
    full = generate(model, tok, "abc", **GREEDY)  # type: ignore[arg-type]
    assert "".join(stream_text(model, tok, "abc", [], "", **GREEDY)) == full
    stop = full[6:8]  # occurs in the text: the output ends where it first begins
    assert "".join(stream_text(model, tok, "abc", [stop], "", **GREEDY)) == _cut(full, stop) != full


def test_a_chat_carries_the_conversation_into_each_reply(model: Llama, capsys: pytest.CaptureFixture) -> None:
    tok = ByteTokenizer()
    messages = chat(model, tok, ["Hi", "And then?"], [], "Be brief.", None, **GREEDY)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    for at, reply in zip((2, 4), replies, strict=True):
        expected = _cut(generate(model, tok, chat_prompt(messages[:at]), **GREEDY), CHAT_STOP)  # type: ignore[arg-type]
        assert reply == expected
    assert capsys.readouterr().out == "".join(f"{r}\n" for r in replies)


def test_the_sample_command_chats_and_refuses_options_that_do_not_go_together(
    tmp_path: Path, shakespeare: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    args = ["train", str(shakespeare), "--out", str(out), *TINY, "--max-steps", "2", "--samples", "0"]
    assert main(args) == 0
    capsys.readouterr()
    greedy = ["--temperature", "0", "--max-new-tokens", "12"]
    assert main(["sample", str(out), "--chat", "--prompt", "Hi", *greedy]) == 0
    one = capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nMore\n"))
    assert main(["sample", str(out), "--chat", *greedy]) == 0
    two = capsys.readouterr().out
    assert two.startswith(one) and len(two) > len(one)  # the same first reply, then a second
    # the penalties reach the sampler: the model's own penalized text, not its plain one
    assert main(["sample", str(out), "--prompt", "ROMEO:", *greedy, "--presence-penalty", "1000"]) == 0
    written = capsys.readouterr().out
    model, tok = load_model(out / "final")
    prompt = tok.encode("ROMEO:")
    penalized = list(stream_ids(model, prompt, **GREEDY_12, penalties=Penalties(presence=1000.0)))
    assert written == "ROMEO:" + tok.decode(penalized) + "\n"
    assert len(set(penalized)) == len(penalized) != len(set(stream_ids(model, prompt, **GREEDY_12)))
    for bad, needle in [
        (["--system", "x"], "--system: only with --chat"),
        (["--stop", ""], "--stop: must not"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(["sample", str(out), *bad])
        assert exc.value.code == 2 and needle in capsys.readouterr().err
