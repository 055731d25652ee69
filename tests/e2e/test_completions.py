"""OpenAI's inference endpoints with the official `openai` SDK (and raw HTTP for the stream's framing)
against the live server and a real inference worker, on a model trained once for the module
(llama-tiny, BPE tokenizer, 40 steps on Shakespeare, a checkpoint at step 20).

Checked: text and usage (prompt_tokens = the prompt's tokens as the model's tokenizer encodes it, the
chat prompt rendered with the trainer's chat template; completion_tokens = tokens generated, all of
max_tokens with finish_reason `length` for a model that never learned EOS), the same seed gives the
same text, a stop sequence cuts the text and is not in it, streamed chunks add up to the text of the
same seed, `data: [DONE]` ends the stream, a checkpoint id is a model, n=2 and unknown models refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.service import SHAKESPEARE, LiveServer, ServiceProcess

PROMPT = "ROMEO:\nWhat"
DEADLINE_S = 600.0


@dataclass
class Trained:
    model: str
    checkpoint: str  # the step-20 checkpoint's model id
    tokenizer: Any  # the model's own tokenizer (trainer.data.tokenizers)


@pytest.fixture(scope="module")
def sdk(e2e_server: LiveServer, e2e_inference_worker: ServiceProcess) -> Iterator[openai.OpenAI]:
    # max_retries=0: a 5xx must fail the test, not be retried away
    client = openai.OpenAI(
        base_url=f"{e2e_server.url}/v1", api_key=e2e_server.api_key, max_retries=0, timeout=120.0
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def trained(
    sdk: openai.OpenAI,
    e2e_settings: Any,
    session_factory: Any,
    service_logs: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Trained:
    with open(SHAKESPEARE, "rb") as fh:
        training_file = sdk.files.create(file=fh, purpose="fine-tune")
    job = sdk.fine_tuning.jobs.create(
        model="llama-tiny",
        training_file=training_file.id,
        seed=3,
        hyperparameters={
            "tokenizer": "bpe",  # type: ignore[typeddict-unknown-key]
            "vocab_size": 320,
            "batch_size": 8,
            "ctx": 64,
            "max_steps": 40,
            "learning_rate": 3e-3,
            "warmup_steps": 5,
            "eval_every": 0,
            "checkpoint_every": 20,
            "export_formats": [],
        },
    )
    deadline = time.monotonic() + DEADLINE_S
    while (job := sdk.fine_tuning.jobs.retrieve(job.id)).status not in ("succeeded", "failed", "cancelled"):
        if time.monotonic() > deadline:
            pytest.fail(f"job {job.id} still {job.status}\n{service_logs()}")
        time.sleep(0.5)
    assert job.status == "succeeded" and job.fine_tuned_model, f"{job.error}\n{service_logs()}"
    checkpoint = f"{job.fine_tuned_model}:ckpt-step-20"
    return Trained(job.fine_tuned_model, checkpoint, _tokenizer(e2e_settings, session_factory, checkpoint))


def _tokenizer(settings: Any, session_factory: Any, model_id: str) -> Any:
    """The tokenizer of a stored checkpoint, read the way the inference worker reads it."""
    from sqlalchemy import select

    from core.blobstore import blobstore_from_settings
    from core.models import Checkpoint
    from trainer.checkpoint import load_model
    from worker.model_cache import checkpoint_dir

    with session_factory() as session:
        blob_id = session.scalar(select(Checkpoint.blob_id).where(Checkpoint.model_id == model_id))
    assert blob_id is not None
    store = blobstore_from_settings(settings, session_factory)
    _, tokenizer = load_model(checkpoint_dir(blob_id, store, Path(settings.data_dir) / "test-copy"))
    assert tokenizer.kind == "bpe"
    return tokenizer


def test_completions(sdk: openai.OpenAI, trained: Trained) -> None:
    c = sdk.completions.create(model=trained.model, prompt=PROMPT, max_tokens=24, temperature=0.8, seed=5)
    assert c.id.startswith("cmpl-") and c.object == "text_completion" and c.model == trained.model
    (choice,) = c.choices
    assert choice.index == 0 and choice.logprobs is None and choice.text
    assert c.usage is not None
    assert c.usage.prompt_tokens == len(trained.tokenizer.encode(PROMPT))
    # trained on plain text, the model never saw EOS: it writes all of max_tokens
    assert (c.usage.completion_tokens, choice.finish_reason) == (24, "length")
    assert c.usage.total_tokens == c.usage.prompt_tokens + 24
    again = sdk.completions.create(model=trained.model, prompt=PROMPT, max_tokens=24, temperature=0.8, seed=5)
    assert again.choices[0].text == choice.text

    # streamed, same seed: the chunks add up to the same text; usage comes last when asked for
    chunks = list(
        sdk.completions.create(
            model=trained.model,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0.8,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == choice.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == c.usage
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].id.startswith("cmpl-")

    # a stop sequence (taken from the text) cuts it where it first occurs and is not returned
    text = choice.text
    stop = text[6:9]
    cut = sdk.completions.create(
        model=trained.model,
        prompt=PROMPT,
        max_tokens=24,
        temperature=0.8,
        seed=5,
        stop=["never-there", stop],
    )
    assert cut.choices[0].text == text[: text.index(stop)] and stop not in cut.choices[0].text
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage is not None and cut.usage.completion_tokens < 24
    streamed_cut = sdk.completions.create(
        model=trained.model, prompt=PROMPT, max_tokens=24, temperature=0.8, seed=5, stop=stop, stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed_cut if ch.choices) == cut.choices[0].text


def test_a_checkpoint_is_a_model_and_generate_agrees(
    sdk: openai.OpenAI, trained: Trained, e2e_server: LiveServer
) -> None:
    c = sdk.completions.create(model=trained.checkpoint, prompt=PROMPT, max_tokens=10, temperature=0)
    assert c.model == trained.checkpoint and c.usage is not None and c.usage.completion_tokens == 10
    final = sdk.completions.create(model=trained.model, prompt=PROMPT, max_tokens=10, temperature=0)
    r = httpx.post(
        f"{e2e_server.url}/v1/models/{trained.model}/generate",
        json={"prompt": PROMPT, "max_tokens": 10, "temperature": 0},
        headers=e2e_server.headers(),
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["text"] == final.choices[0].text
    assert final.usage is not None and r.json()["usage"] == final.usage.model_dump(exclude_none=True)


def test_chat_completions(sdk: openai.OpenAI, trained: Trained) -> None:
    from trainer.data.chat import chat_prompt

    messages: list[Any] = [
        {"role": "system", "content": "You are a player."},
        {"role": "user", "content": "Speak, Juliet."},
    ]
    chat = sdk.chat.completions.create(
        model=trained.model, messages=messages, max_completion_tokens=16, temperature=0.7, seed=3
    )
    assert chat.id.startswith("chatcmpl-") and chat.object == "chat.completion"
    (choice,) = chat.choices
    assert choice.message.role == "assistant" and choice.message.content is not None
    assert "\n<|" not in choice.message.content  # the reply ends where a next message would begin
    rendered = chat_prompt(messages)
    assert rendered == "<|system|>\nYou are a player.\n<|user|>\nSpeak, Juliet.\n<|assistant|>\n"
    assert chat.usage is not None and chat.usage.prompt_tokens == len(trained.tokenizer.encode(rendered))
    assert 0 < chat.usage.completion_tokens <= 16
    # cut at the bound, or ended (EOS on the 16th token counts: a reply of 16 that stopped)
    assert choice.finish_reason == "stop" or chat.usage.completion_tokens == 16

    chunks = list(
        sdk.chat.completions.create(
            model=trained.model, messages=messages, max_tokens=16, temperature=0.7, seed=3, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_refusals(sdk: openai.OpenAI, trained: Trained) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.completions.create(model=trained.model, prompt="x", n=2)
    assert bad.value.param == "n"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=trained.model, messages=[{"role": "user", "content": "x"}], n=2)
    assert bad.value.param == "n"  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.completions.create(model=f"{trained.model}:ckpt-step-7", prompt="x")
    assert missing.value.code == "model_not_found"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as base:  # a base model: listed, but with no weights
        sdk.chat.completions.create(model="llama-tiny", messages=[{"role": "user", "content": "x"}])
    assert base.value.code == "base_model"  # type: ignore[attr-defined]


def test_the_stream_is_server_sent_events_ending_with_done(e2e_server: LiveServer, trained: Trained) -> None:
    body = {
        "model": trained.model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 12,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", f"{e2e_server.url}/v1/chat/completions", json=body, headers=e2e_server.headers(), timeout=120
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("\n\n")
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), raw
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and set(chunks[-1]["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
    }
    assert all(c["usage"] is None for c in chunks[:-1])


def test_penalties_and_logit_bias_reach_the_sampler(sdk: openai.OpenAI, trained: Trained) -> None:
    """OpenAI's presence_penalty, frequency_penalty and logit_bias through the SDK: a +100 bias makes
    every token the biased one, the largest penalties change the greedy text, and a token id past
    the model's vocabulary is a 400 naming logit_bias."""
    token = trained.tokenizer.encode(" the")[0]
    biased = sdk.completions.create(
        model=trained.model,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0.8,
        seed=1,
        logit_bias={str(token): 100},
    )
    assert biased.choices[0].text == trained.tokenizer.decode([token] * 6)
    greedy = {"model": trained.model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    plain = sdk.completions.create(**greedy)
    penalized = sdk.completions.create(**greedy, presence_penalty=2, frequency_penalty=2)
    assert penalized.choices[0].text != plain.choices[0].text
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.completions.create(model=trained.model, prompt="x", logit_bias={"320": 1})  # vocab_size 320
    assert bad.value.param == "logit_bias"  # type: ignore[attr-defined]
    assert "not in this model's vocabulary" in str(bad.value)
