"""/v1/completions, /v1/chat/completions and /generate in the API process alone (real PostgreSQL and
Redis, no inference worker): what is refused before anything is queued (400 naming the field, 404 for
a model that is not yours), and what happens when no worker takes the request (503
`no_inference_worker`) or the broker is down (503 `broker_unavailable`) — the request's row is gone
either way. Completions themselves: tests/api/test_inference_service.py and tests/e2e/test_completions.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from core.models import InferenceRequest
from core.settings import Settings
from tests.api.conftest import Factory, Tenant, count
from tests.api.test_errors import assert_envelope
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - a fixture, used below

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture
def model_id(factory: Factory, tenant: Tenant, tiny_checkpoint_tar: bytes) -> str:  # noqa: F811
    return factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)[1]


def chat_body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], **extra}


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        (COMPLETIONS, {"n": 2}, "n"),
        (CHAT, {"n": 3}, "n"),
        (COMPLETIONS, {"n": 1000}, "n"),  # "only n=1", not "at most 128"
        (COMPLETIONS, {"max_tokens": 0}, "max_tokens"),
        (COMPLETIONS, {"max_tokens": 2049}, "max_tokens"),  # past max_completion_tokens (2048)
        (CHAT, {"max_completion_tokens": 5000}, "max_completion_tokens"),
        (CHAT, {"max_tokens": 5000}, "max_tokens"),
        (COMPLETIONS, {"prompt": ["one", "two"]}, "prompt"),
        (COMPLETIONS, {"prompt": [[1], [2]]}, "prompt"),  # token ids are served, one prompt at a time
        (COMPLETIONS, {"prompt": [1, 300]}, "prompt"),  # past the model's 258 tokens
        (COMPLETIONS, {"prompt": [-1]}, "prompt"),
        (COMPLETIONS, {"prompt": [1.5]}, "prompt"),
        (COMPLETIONS, {"prompt": [1] * 100_001}, "prompt"),
        (COMPLETIONS, {"prompt": "x" * 200_001}, "prompt"),
        (COMPLETIONS, {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (COMPLETIONS, {"stop": 5}, "stop"),
        (COMPLETIONS, {"temperature": 2.5}, "temperature"),
        (COMPLETIONS, {"top_p": 1.5}, "top_p"),
        (COMPLETIONS, {"seed": 2**64}, "seed"),
        (COMPLETIONS, {"logprobs": 6}, "logprobs"),  # OpenAI's bound: 5
        (COMPLETIONS, {"logprobs": -1}, "logprobs"),
        (COMPLETIONS, {"echo": "yes"}, "echo"),
        (COMPLETIONS, {"max_tokens": 0, "echo": False}, "max_tokens"),  # 0 only scores an echoed prompt
        (COMPLETIONS, {"best_of": 2}, "best_of"),
        (COMPLETIONS, {"suffix": "end"}, "suffix"),
        (COMPLETIONS, {"logit_bias": {"50256": -100}}, "logit_bias"),  # past the model's 258 tokens
        (CHAT, {"logit_bias": {"5": 101}}, "logit_bias.5"),
        (COMPLETIONS, {"logit_bias": {"five": 1}}, "logit_bias"),
        (COMPLETIONS, {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        (COMPLETIONS, {"presence_penalty": 2.5}, "presence_penalty"),
        (CHAT, {"frequency_penalty": -3}, "frequency_penalty"),
        (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),  # OpenAI's bound: 20
        (CHAT, {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        (CHAT, {"logprobs": 1}, "logprobs"),  # a boolean
        (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        (CHAT, {"response_format": {"type": "json_object"}}, "response_format"),
        (COMPLETIONS, {"stream_options": {"include_usage": True}}, "stream_options"),
        (COMPLETIONS, {"functions": []}, "functions"),  # not OpenAI's completions field: unknown
        # OpenAI's chat features this service lacks: refused when asked for (null is accepted below)
        (CHAT, {"functions": [{"name": "f"}]}, "functions"),
        (CHAT, {"modalities": ["text", "audio"]}, "modalities"),
        (CHAT, {"reasoning_effort": "high"}, "reasoning_effort"),
        (CHAT, {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        (CHAT, {"messages": []}, "messages"),
        (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (CHAT, {"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content"),
        (CHAT, {"messages": [{"role": "user", "content": "x" * 150_000}] * 2}, "messages"),
    ],
)
def test_invalid_requests_are_400_naming_the_field(
    client: TestClient,
    tenant: Tenant,
    session_factory: Any,
    model_id: str,
    path: str,
    extra: dict[str, Any],
    param: str,
) -> None:
    body = chat_body(model_id, **extra) if path == CHAT else {"model": model_id, "prompt": "x", **extra}
    err = assert_envelope(client.post(path, json=body, headers=tenant.headers), 400)
    assert err["param"] == param, err
    assert param != "n" or "only n=1 is supported" in err["message"], err
    assert count(session_factory, InferenceRequest, InferenceRequest.owner_id == tenant.owner_id) == 0


def test_the_developer_role_is_the_system_role() -> None:
    """OpenAI's newer name for `system`: the chat is rendered with the role the model was trained on."""
    from api.completion_models import ChatCompletionRequest

    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "x"}],
        }
    )
    assert [m.role for m in body.messages] == ["system", "user"]


def test_unknown_models_are_404_and_another_owners_too(
    client: TestClient, tenant: Tenant, other: Tenant, model_id: str
) -> None:
    for path, body in (
        (COMPLETIONS, {"model": "ft:llama-tiny:nope", "prompt": "x"}),
        # null is "not given" for every optional field (a null stop once answered 500)
        (COMPLETIONS, {"model": "ft:llama-tiny:nope", "prompt": ["x"], "stop": None, "max_tokens": None}),
        (CHAT, {**chat_body("ft:llama-tiny:nope"), "stop": None, "n": None, "stream_options": None}),
        # every chat field the SDK knows, null (the SDK sends a None the caller passed) or asking for
        # nothing; the caller hints (safety_identifier, prompt_cache_key, service_tier) are ignored
        (
            CHAT,
            {
                **chat_body("ft:llama-tiny:nope"),
                **dict.fromkeys(
                    ["audio", "prediction", "reasoning_effort", "verbosity", "web_search_options"]
                ),
                **{"functions": [], "function_call": "none", "modalities": ["text"]},
                **{"safety_identifier": "u-1", "prompt_cache_key": "k", "service_tier": "auto"},
            },
        ),
        ("/v1/models/ft:llama-tiny:nope/generate", {"prompt": "x"}),
    ):
        err = assert_envelope(client.post(path, json=body, headers=tenant.headers), 404)
        assert (err["code"], err["param"]) == ("model_not_found", "model")
    # a preset is a base model (GET /v1/models lists it), with no trained weights to answer with
    err = assert_envelope(client.post(CHAT, json=chat_body("llama-tiny"), headers=tenant.headers), 400)
    assert (err["code"], err["param"]) == ("base_model", "model")
    err = assert_envelope(client.post(CHAT, json=chat_body(model_id), headers=other.headers), 404)
    assert err["code"] == "model_not_found"


@pytest.mark.parametrize("stream", [False, True])
def test_no_inference_worker_is_503_and_the_request_is_withdrawn(
    settings: Settings, tenant: Tenant, session_factory: Any, model_id: str, stream: bool
) -> None:
    quick = settings.model_copy(update={"inference_wait_seconds": 0.5})
    with TestClient(create_app(quick)) as client:
        for path, body in (
            (COMPLETIONS, {"model": model_id, "prompt": "x", "stream": stream}),
            (CHAT, chat_body(f"{model_id}:ckpt-step-50", stream=stream)),
        ):
            r = client.post(path, json=body, headers=tenant.headers)
            err = assert_envelope(r, 503)
            assert err["code"] == "no_inference_worker"
            assert r.headers["x-should-retry"] == "false"  # it waited already: an SDK must not wait again
            assert "fromscratch worker --queues inference" in err["message"]
    assert count(session_factory, InferenceRequest, InferenceRequest.owner_id == tenant.owner_id) == 0


def test_broker_down_is_503_and_nothing_is_left(
    settings: Settings, tenant: Tenant, session_factory: Any, model_id: str
) -> None:
    bad = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(bad)) as client:
        r = client.post(COMPLETIONS, json={"model": model_id, "prompt": "x"}, headers=tenant.headers)
        assert assert_envelope(r, 503)["code"] == "broker_unavailable"
    assert count(session_factory, InferenceRequest, InferenceRequest.owner_id == tenant.owner_id) == 0


def test_other_methods_are_405(client: TestClient, tenant: Tenant) -> None:
    for path in (COMPLETIONS, CHAT):
        r = client.get(path, headers=tenant.headers)
        assert assert_envelope(r, 405)["code"] == "method_not_allowed"
        assert r.headers["allow"] == "POST"


def test_a_key_with_as_many_completions_as_it_may_have_is_429_and_others_are_not(
    settings: Settings, tenant: Tenant, other: Tenant, factory: Factory, session_factory: Any, model_id: str
) -> None:
    """max_completions_per_key: one key cannot hold every inference slot. Its queued completion (a
    row as the API inserts it) uses its one; another key's request goes on (to 503: no worker here)."""
    with session_factory() as s:
        s.add(InferenceRequest(owner_id=tenant.owner_id, model_id=model_id, blob_id="b", params={}))
        s.commit()
    limited = settings.model_copy(update={"max_completions_per_key": 1, "inference_wait_seconds": 0.5})
    with TestClient(create_app(limited)) as client:
        r = client.post(COMPLETIONS, json={"model": model_id, "prompt": "x"}, headers=tenant.headers)
        err = assert_envelope(r, 429)
        assert err["code"] == "quota_exceeded" and "FROMSCRATCH_MAX_COMPLETIONS_PER_KEY" in err["message"], (
            err
        )
        assert "1 completions queued or running" in err["message"] and r.headers["retry-after"] == "2"
        # a slot frees within seconds: the SDK may retry after Retry-After (other quotas say false)
        assert r.headers["x-should-retry"] == "true"
        _, theirs = factory.finished_model(other.owner_id)
        r = client.post(COMPLETIONS, json={"model": theirs, "prompt": "x"}, headers=other.headers)
        assert assert_envelope(r, 503)["code"] == "no_inference_worker"
    assert count(session_factory, InferenceRequest, InferenceRequest.owner_id == tenant.owner_id) == 1
