"""logprobs and echo through a live API server and a real inference worker, read with the openai SDK:
the reported logprobs are the model's own log-softmax (checked against a direct torch computation
on the same checkpoint, whatever the sampling settings), echo with max_tokens 0 scores the prompt
(its log-likelihood), streamed chunks carry their tokens' logprobs, and the bounds are 400s naming
the field. The tiny untrained checkpoint has a byte tokenizer, so each token is one byte."""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.api.conftest import Factory
from tests.api.test_inference_service import owner_of, sdk_for
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - a fixture, used below
from tests.fixtures.service import LiveServer, ServiceProcess

TOL = 1e-3


@pytest.fixture
def scored(
    live_server: LiveServer,
    inference_worker: ServiceProcess,
    factory: Factory,
    session_factory: Any,
    tiny_checkpoint_tar: bytes,  # noqa: F811
    tmp_path: Path,
) -> tuple[openai.OpenAI, str, Any]:
    """(the SDK, a model id, the same checkpoint loaded here)."""
    from trainer.checkpoint import load_model

    _, model_id = factory.finished_model(
        owner_of(live_server, session_factory), tar_bytes=tiny_checkpoint_tar
    )
    with tarfile.open(fileobj=io.BytesIO(tiny_checkpoint_tar)) as tf:
        tf.extractall(tmp_path / "ckpt", filter="data")
    model, _ = load_model(next((tmp_path / "ckpt").iterdir()))
    return sdk_for(live_server), model_id, model.eval()


def logprobs_after(model: Any, ids: list[int]) -> Any:
    """log_softmax of the model's logits after `ids`: the distribution of the next token."""
    import torch

    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    return torch.log_softmax(logits[0, -1].float(), dim=-1)


def token_id(text: str) -> int:
    """A byte tokenizer's token back from its string (OpenAI's "bytes:\\xNN" for a part of a character)."""
    raw = (
        bytes.fromhex(text[len("bytes:") :].replace("\\x", ""))
        if text.startswith("bytes:")
        else text.encode()
    )
    assert len(raw) == 1, text
    return raw[0]


def token_text(byte: int) -> str:
    try:
        return bytes([byte]).decode()
    except UnicodeDecodeError:
        return f"bytes:\\x{byte:02x}"


def test_completion_logprobs_are_the_models_log_softmax(scored: tuple[openai.OpenAI, str, Any]) -> None:
    sdk, model_id, model = scored
    prompt = "Hello"
    # sampled, hot and penalised: the logprobs reported are still those of the raw logits
    r = sdk.completions.create(
        model=model_id, prompt=prompt, max_tokens=8, logprobs=3, temperature=1.7, presence_penalty=1.5, seed=3
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert len(lp.tokens) == r.usage.completion_tokens  # type: ignore[union-attr]
    ids = list(prompt.encode())
    for i, token in enumerate(lp.tokens):
        expected = logprobs_after(model, ids)
        chosen = token_id(token)
        assert math.isclose(lp.token_logprobs[i], float(expected[chosen]), abs_tol=TOL), (i, token)
        top = expected.topk(3)
        listed = lp.top_logprobs[i]
        # the 3 likeliest, then the token itself where it is not one of them (OpenAI's logprobs+1)
        want = [int(t) for t in top.indices] + ([] if chosen in top.indices else [chosen])
        assert listed is not None and list(listed) == [token_text(t) for t in want]
        for value, t in zip(listed.values(), want, strict=True):
            assert math.isclose(value, float(expected[t]), abs_tol=TOL)
        ids.append(chosen)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert any(len(listed or {}) == 4 for listed in lp.top_logprobs)  # hot sampling left the top 3

    # logprobs 0: each token's own logprob is its whole list
    zero = sdk.completions.create(model=model_id, prompt=prompt, max_tokens=3, logprobs=0, temperature=0)
    zlp = zero.choices[0].logprobs
    assert zlp is not None and zlp.tokens and zlp.token_logprobs and zlp.top_logprobs
    assert len(zlp.token_logprobs) == zero.usage.completion_tokens  # type: ignore[union-attr]
    assert zlp.top_logprobs == [{t: v} for t, v in zip(zlp.tokens, zlp.token_logprobs, strict=True)]


def test_echo_with_max_tokens_0_scores_the_prompt(scored: tuple[openai.OpenAI, str, Any]) -> None:
    import torch

    sdk, model_id, model = scored
    prompt = "héllo wörld"  # two-byte characters: two tokens each, "bytes:\\xc3" then "bytes:\\xa9"
    r = sdk.completions.create(model=model_id, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    choice = r.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert (
        r.usage is not None
        and r.usage.completion_tokens == 0
        and r.usage.prompt_tokens == len(prompt.encode())
    )
    lp = choice.logprobs
    assert lp is not None and lp.tokens == [token_text(b) for b in prompt.encode()]
    assert lp.tokens[1:3] == ["bytes:\\xc3", "bytes:\\xa9"]
    assert lp.token_logprobs is not None and lp.token_logprobs[0] is None
    assert lp.top_logprobs is not None and lp.top_logprobs[0] is None
    assert lp.tokens[1] in (lp.top_logprobs[1] or {}) and 1 <= len(lp.top_logprobs[1] or {}) <= 2
    assert lp.text_offset is not None and lp.text_offset[:4] == [0, 1, 1, 2]
    ids = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        logits, _ = model(ids)
    likelihood = -torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum").item()
    assert math.isclose(sum(lp.token_logprobs[1:]), likelihood, abs_tol=TOL * len(prompt))

    # echo with a completion: the prompt, then the generated text, both with their tokens
    both = sdk.completions.create(
        model=model_id, prompt="ab", max_tokens=2, echo=True, logprobs=1, temperature=0
    )
    text, blp = both.choices[0].text, both.choices[0].logprobs
    assert (
        text.startswith("ab") and blp is not None and blp.tokens is not None and blp.tokens[:2] == ["a", "b"]
    )
    assert len(blp.tokens) == 2 + both.usage.completion_tokens
    assert all(offset >= 2 for offset in (blp.text_offset or [])[2:])


def test_streamed_chunks_carry_their_tokens_logprobs(scored: tuple[openai.OpenAI, str, Any]) -> None:
    sdk, model_id, _ = scored
    kwargs: dict[str, Any] = dict(
        model=model_id, prompt="abc", max_tokens=6, echo=True, logprobs=2, temperature=0
    )
    whole = sdk.completions.create(**kwargs).choices[0]
    text, tokens, values = "", list[str](), list[float | None]()
    for chunk in sdk.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        text += choice.text
        if choice.logprobs is not None:
            tokens += choice.logprobs.tokens or []
            values += choice.logprobs.token_logprobs or []
    assert whole.logprobs is not None
    assert text == whole.text and tokens == whole.logprobs.tokens and values == whole.logprobs.token_logprobs


def test_a_streamed_characters_bytes_come_with_its_chunk(scored: tuple[openai.OpenAI, str, Any]) -> None:
    """A character of several bytes is several byte tokens, the first ones with no text of their
    own: all of them come in the chunk that holds the character, not the one before it."""
    sdk, model_id, _ = scored
    # "\xc3" and "\xa9" ("é" together) far above every other byte; the penalty alternates them
    two_bytes = {"195": 100.0, "169": 100.0}
    chunks = sdk.completions.create(
        model=model_id,
        prompt="a",
        max_tokens=12,
        temperature=0,
        logprobs=0,
        logit_bias=two_bytes,
        frequency_penalty=2.0,
        stream=True,
    )
    text, held = "", 0
    for chunk in chunks:
        choice = chunk.choices[0]
        offsets = (choice.logprobs.text_offset or []) if choice.logprobs else []
        if choice.text:
            assert all(len(text) <= o < len(text) + len(choice.text) for o in offsets), (text, choice)
            held += sum(1 for o in offsets if o == len(text)) > 1  # a character's bytes, together
        text += choice.text
    assert "é" in text and held, text


def test_chat_logprobs(scored: tuple[openai.OpenAI, str, Any]) -> None:
    from trainer.data.chat import chat_prompt

    sdk, model_id, model = scored
    messages: list[Any] = [{"role": "user", "content": "Hi"}]
    kwargs: dict[str, Any] = dict(
        model=model_id, messages=messages, max_tokens=6, temperature=0, logprobs=True
    )
    r = sdk.chat.completions.create(top_logprobs=2, **kwargs)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content and lp.refusal is None
    ids = list(chat_prompt(messages).encode())
    for item in lp.content:
        expected = logprobs_after(model, ids)
        assert item.bytes is not None and len(item.bytes) == 1
        assert math.isclose(item.logprob, float(expected[item.bytes[0]]), abs_tol=TOL)
        assert [t.bytes for t in item.top_logprobs] == [[int(i)] for i in expected.topk(2).indices]
        ids += item.bytes
    assert b"".join(bytes(item.bytes or []) for item in lp.content).decode(errors="replace") == (
        r.choices[0].message.content
    )
    streamed: list[Any] = []
    for chunk in sdk.chat.completions.create(stream=True, top_logprobs=2, **kwargs):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content or []
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in lp.content]


def test_bounds_are_400_naming_the_field(
    live_server: LiveServer, scored: tuple[openai.OpenAI, str, Any]
) -> None:
    _, model_id, _ = scored
    headers = {"Authorization": f"Bearer {live_server.api_key}"}
    cases: list[tuple[str, dict[str, Any], str]] = [
        (
            "completions",
            {"prompt": "x" * 40, "echo": True, "logprobs": 0, "max_tokens": 0},
            "prompt",
        ),  # ctx 32
        ("completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
        ("completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
    ]
    for path, extra, param in cases:
        r = httpx.post(
            f"{live_server.url}/v1/{path}", json={"model": model_id, **extra}, headers=headers, timeout=60
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, extra, r.text)
    # the largest values are accepted
    ok = httpx.post(
        f"{live_server.url}/v1/completions",
        json={"model": model_id, "prompt": "x" * 32, "echo": True, "logprobs": 5, "max_tokens": 0},
        headers=headers,
        timeout=60,
    )
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["choices"][0]["logprobs"]["top_logprobs"][1]) in (5, 6)


def test_a_prompt_of_token_ids_is_the_prompt_those_tokens_make(
    live_server: LiveServer, scored: tuple[openai.OpenAI, str, Any]
) -> None:
    """OpenAI's token-id prompts, as lm-evaluation-harness sends them for log-likelihoods: a list of
    ids, or a batch of one, scored with echo as the same text would be; ids outside the vocabulary
    and batches of several are 400s naming `prompt`."""
    sdk, model_id, _ = scored
    text = "ab cd"
    scoring: dict[str, Any] = dict(model=model_id, max_tokens=1, echo=True, logprobs=1, temperature=0)
    by_text = sdk.completions.create(prompt=text, **scoring).choices[0]
    for prompt in (list(text.encode()), [list(text.encode())]):
        by_ids = sdk.completions.create(prompt=prompt, **scoring)
        choice = by_ids.choices[0]
        assert choice.text == by_text.text and choice.text.startswith(text)
        assert choice.logprobs is not None and by_text.logprobs is not None
        assert choice.logprobs.tokens == by_text.logprobs.tokens
        assert choice.logprobs.token_logprobs == by_text.logprobs.token_logprobs
        assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(text)
    headers = {"Authorization": f"Bearer {live_server.api_key}"}
    for prompt in ([258], [[1], [2]], ["a", "b"], [1, "a"], [-1]):
        r = httpx.post(
            f"{live_server.url}/v1/completions",
            json={"model": model_id, "prompt": prompt},
            headers=headers,
            timeout=60,
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", (prompt, r.text)


def test_a_completion_that_ends_on_eos_lists_it(scored: tuple[openai.OpenAI, str, Any]) -> None:
    """lm-evaluation-harness scores a continuation with echo and max_tokens 1, then drops the last
    token listed as the generated one: the EOS a completion ends on must be listed (no text, its own
    logprob), or the continuation's last token would be dropped instead. A chat lists only its text."""
    from trainer.data.tokenizers import EOS_ID

    sdk, model_id, model = scored
    prompt = "ab cd"
    eos_first = {str(EOS_ID): 100.0}  # biased past every other token: EOS is picked at once
    r = sdk.completions.create(
        model=model_id,
        prompt=prompt,
        max_tokens=1,
        echo=True,
        logprobs=1,
        temperature=0,
        logit_bias=eos_first,
    )
    choice = r.choices[0]
    assert choice.text == prompt and choice.finish_reason == "stop"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), 1)
    lp = choice.logprobs
    assert lp is not None and lp.tokens == [*prompt, "</s>"] and lp.token_logprobs and lp.text_offset
    assert lp.text_offset[-1] == len(prompt)
    expected = logprobs_after(model, list(prompt.encode()))
    assert math.isclose(lp.token_logprobs[-1], float(expected[EOS_ID]), abs_tol=TOL)  # unbiased
    assert len(lp.token_logprobs[len(prompt) : -1]) == 0  # what lm-eval sums for an empty continuation

    chat = sdk.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        logit_bias=eos_first,
    )
    reply = chat.choices[0]
    assert reply.message.content == "" and reply.finish_reason == "stop"
    assert reply.logprobs is not None and reply.logprobs.content == []
    assert chat.usage is not None and chat.usage.completion_tokens == 1
