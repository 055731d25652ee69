"""Completions through a live API server (uvicorn) and a real inference worker process
(`fromscratch worker --queues inference`), on an untrained tiny checkpoint (byte tokenizer): its
random bytes split UTF-8 characters everywhere, which the streamed text must survive. The worker
stops when the client goes away (streamed or not), and deletes the rows a dead API left behind.
The openai SDK against a trained model: tests/e2e/test_completions.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import delete, select

from core.models import InferenceRequest, utcnow
from tests.api.conftest import Factory
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - a fixture, used below
from tests.fixtures.service import LiveServer, ServiceProcess, wait_until


@pytest.fixture(scope="module")
def endless_checkpoint_tar(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A tiny checkpoint that never ends a completion: EOS's logit is 0 while sharpened weights
    put the likeliest token's far above it, so only max_tokens stops it."""
    import io
    import tarfile

    import torch

    from trainer.checkpoint import save_checkpoint
    from trainer.config import ModelConfig, TrainConfig
    from trainer.data.tokenizers import ByteTokenizer
    from trainer.model.llama import Llama

    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, ctx=32, vocab_size=258, tie_embeddings=False)
    model = Llama(cfg)
    with torch.no_grad():
        model.output.weight.mul_(50)
        model.output.weight[ByteTokenizer().eos_id] = 0
    folder = save_checkpoint(
        tmp_path_factory.mktemp("endless") / "step-00000050",
        model=model,
        model_config=cfg,
        train_config=TrainConfig(),
        tokenizer=ByteTokenizer(),
        state={"step": 50, "tokens_seen": 0, "best_val_loss": None, "sampler": {}, "total_steps": 50},
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(folder, arcname=folder.name)
    return buf.getvalue()


@pytest.fixture
def endless_model(
    live_server: LiveServer, factory: Factory, session_factory: Any, endless_checkpoint_tar: bytes
) -> tuple[str, str]:
    """(the live server key's owner, a finished model of theirs that never ends a completion)."""
    owner = owner_of(live_server, session_factory)
    _, model_id = factory.finished_model(owner, tar_bytes=endless_checkpoint_tar)
    return owner, model_id


def owner_of(live_server: LiveServer, session_factory: Any) -> str:
    from core.keys import verify_key

    with session_factory() as session:
        key = verify_key(session, live_server.api_key)
        assert key is not None
        return key.owner_id


def rows(session_factory: Any, owner_id: str) -> list[InferenceRequest]:
    with session_factory() as session:
        found = session.scalars(select(InferenceRequest).where(InferenceRequest.owner_id == owner_id)).all()
        session.expunge_all()
        return list(found)


def sdk_for(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{live_server.url}/v1", api_key=live_server.api_key, max_retries=0, timeout=120
    )


def test_completions_are_generated_by_the_inference_worker(
    live_server: LiveServer,
    inference_worker: ServiceProcess,
    factory: Factory,
    session_factory: Any,
    tiny_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    owner = owner_of(live_server, session_factory)
    _, model_id = factory.finished_model(owner, tar_bytes=tiny_checkpoint_tar)
    # what a dead API process would leave: an old row (swept by the worker's first request) and a
    # recent one (left alone); another key's, as they would count toward this key's
    # max_completions_per_key (4, all used below)
    gone = f"{owner}-gone"
    with session_factory() as session:
        old = InferenceRequest(owner_id=gone, model_id=model_id, blob_id="x", params={}, status="running")
        old.created_at = utcnow() - timedelta(days=1)
        recent = InferenceRequest(owner_id=gone, model_id=model_id, blob_id="x", params={})
        session.add_all([old, recent])
        session.commit()
        recent_id = recent.id
    sdk = sdk_for(live_server)
    logs = inference_worker.output

    # several at once before the model is loaded: one thread loads it, the others wait for it; the
    # same seed gives the same text in every thread
    with ThreadPoolExecutor(4) as pool:
        texts = list(
            pool.map(
                lambda _: (
                    sdk.completions.create(model=model_id, prompt="x", max_tokens=20, seed=8).choices[0].text
                ),
                range(4),
            )
        )
    assert len(set(texts)) == 1, texts

    # greedy: /generate, /v1/completions and the checkpoint's id (the same weights) agree
    generate = httpx.post(
        f"{live_server.url}/v1/models/{model_id}/generate",
        json={"prompt": "ab", "max_tokens": 12, "temperature": 0},
        headers=live_server.headers(),
        timeout=120,
    )
    assert generate.status_code == 200, f"{generate.text}\n{logs()}"
    greedy = generate.json()["text"]
    assert generate.json()["usage"]["prompt_tokens"] == 2  # two bytes
    assert [r.id for r in rows(session_factory, gone)] == [recent_id]  # the old one swept
    assert rows(session_factory, owner) == []  # the completions' own rows deleted
    for model in (model_id, f"{model_id}:ckpt-step-50"):
        c = sdk.completions.create(model=model, prompt="ab", max_tokens=12, temperature=0)
        assert c.choices[0].text == greedy and c.model == model
        assert c.usage is not None and c.usage.prompt_tokens == 2
        assert c.choices[0].finish_reason == "stop" or c.usage.completion_tokens == 12
    # a temperature under 1e-3 or a top_p keeping one token is greedy too; any 64-bit seed works
    for extra in ({"temperature": 1e-40}, {"top_p": 5e-324, "seed": 3}, {"top_p": 0.0}):
        c = sdk.completions.create(model=model_id, prompt="ab", max_tokens=12, **extra)  # type: ignore[arg-type]
        assert c.choices[0].text == greedy, extra
    for seed in (2**64 - 1, -(2**63)):
        c = sdk.completions.create(model=model_id, prompt="", max_tokens=4, seed=seed)
        assert c.usage is not None and c.usage.prompt_tokens == 0  # an empty prompt starts from BOS

    # random bytes, streamed: the chunks add up to the text of the same seed, U+FFFD and all
    sampled = sdk.completions.create(model=model_id, prompt="Hi", max_tokens=60, seed=11, temperature=1.0)
    text = sampled.choices[0].text
    assert sampled.usage is not None and sampled.usage.completion_tokens <= 60
    chunks = list(
        sdk.completions.create(
            model=model_id,
            prompt="Hi",
            max_tokens=60,
            seed=11,
            temperature=1.0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage == sampled.usage and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == sampled.choices[0].finish_reason
    # a stop sequence taken from that text cuts it where it first occurs, and is not returned
    stop = next(text[i : i + 2] for i in range(3, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    cut = sdk.completions.create(
        model=model_id, prompt="Hi", max_tokens=60, seed=11, temperature=1.0, stop=[stop, "never-there"]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage is not None and cut.usage.completion_tokens < 60

    # the checkpoint was extracted once for this worker, and the rows are gone
    models_dir = live_server.settings.work_path / "models"
    assert [p.name for p in models_dir.iterdir() if (p / ".complete").exists()] == [
        r.blob_id for r in _checkpoints(session_factory, model_id)
    ]
    assert rows(session_factory, owner) == [] and [r.id for r in rows(session_factory, gone)] == [recent_id]
    with session_factory() as session:
        session.execute(delete(InferenceRequest).where(InferenceRequest.id == recent_id))
        session.commit()


def _checkpoints(session_factory: Any, model_id: str) -> list[Any]:
    from core.models import Checkpoint

    with session_factory() as session:
        found = session.scalars(
            select(Checkpoint).where(Checkpoint.model_id == f"{model_id}:ckpt-step-50")
        ).all()
        session.expunge_all()
        return list(found)


@pytest.mark.service_settings(max_completion_tokens=10_000_000)
def test_a_client_that_goes_away_stops_the_worker(
    live_server: LiveServer,
    inference_worker: ServiceProcess,
    session_factory: Any,
    endless_model: tuple[str, str],
) -> None:
    owner, model_id = endless_model
    body = {"model": model_id, "prompt": "Hi", "max_tokens": 10_000_000, "temperature": 1.0}
    url = f"{live_server.url}/v1/completions"

    def withdrawn() -> int:
        return inference_worker.output(tail=1_000_000).count("the request was withdrawn")

    # streamed: read a few events, then hang up
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", url, json={**body, "stream": True}, headers=live_server.headers()) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            # read three events without closing the line iterator: leaving a `for` over it early
            # closes it, and with it the connection, and the API would be right to delete the row
            lines = r.iter_lines()
            events = 0
            while events < 3:
                events += next(lines).startswith("data: ")
            (running,) = rows(session_factory, owner)
            assert running.status == "running"
    wait_until(lambda: not rows(session_factory, owner), timeout=60, message="the API to delete the row")
    wait_until(
        lambda: withdrawn() == 1,
        timeout=60,
        message=lambda: f"the worker to stop\n{inference_worker.output()}",
    )
    assert f"inference {running.id}: stopped after" in inference_worker.output(tail=1_000_000)

    # not streamed: the client gives up waiting
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=body, headers=live_server.headers(), timeout=httpx.Timeout(30, read=3))
    wait_until(lambda: not rows(session_factory, owner), timeout=60, message="the API to delete the row")
    wait_until(
        lambda: withdrawn() == 2,
        timeout=60,
        message=lambda: f"the worker to stop\n{inference_worker.output()}",
    )


@pytest.mark.service_settings(max_completion_tokens=10_000_000, max_inference_seconds=2)
def test_a_completion_ends_at_max_inference_seconds(
    live_server: LiveServer,
    inference_worker: ServiceProcess,
    session_factory: Any,
    endless_model: tuple[str, str],
) -> None:
    owner, model_id = endless_model
    c = sdk_for(live_server).completions.create(model=model_id, prompt="Hi", max_tokens=10_000_000)
    assert c.choices[0].finish_reason == "length"
    assert c.usage is not None and 0 < c.usage.completion_tokens < 10_000_000
    assert len(c.choices[0].text) > 0 and not rows(session_factory, owner)


def test_a_chat_without_a_bound_replies_until_the_context_is_full(
    live_server: LiveServer, inference_worker: ServiceProcess, endless_model: tuple[str, str]
) -> None:
    """OpenAI's default for a chat: the reply may take what the context leaves after the prompt,
    not the server's bound (2048 here, against a context of 32)."""
    _, model_id = endless_model
    sdk = sdk_for(live_server)
    no_newline = {"10": -100}  # the chat template's stop starts with one; the endless model never ends
    c = sdk.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi"}], logit_bias=no_newline
    )
    assert c.choices[0].finish_reason == "length" and c.usage is not None
    assert c.usage.prompt_tokens + c.usage.completion_tokens == 32, c.usage
    bounded = sdk.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi"}], logit_bias=no_newline, max_tokens=40
    )
    assert bounded.usage is not None and bounded.usage.completion_tokens == 40  # asked for: context-shifted
    # a conversation longer than the context keeps its last half (ctx/2 = 16 tokens); the reply
    # takes the other half, not the single token "what the context leaves" would give
    long = sdk.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi " * 30}], logit_bias=no_newline
    )
    assert long.usage is not None and long.usage.prompt_tokens > 32 and long.usage.completion_tokens == 16
    # cut by max_tokens after a newline (no EOS): the newline is the reply's, with its logprob
    only_newlines = {str(t): -100 for t in range(258) if t != 10} | {
        "10": 100
    }  # the model's logits are sharp
    newlines = sdk.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Hi"}],
        logit_bias=only_newlines,
        max_tokens=3,
        logprobs=True,
    )
    (choice,) = newlines.choices
    assert choice.message.content == "\n\n\n" and choice.finish_reason == "length"
    assert choice.logprobs is not None and [t.token for t in choice.logprobs.content or []] == ["\n"] * 3
