"""OpenAI's inference endpoints over your fine-tuned models and checkpoints, served by the inference
workers (api/inference.py; the API process loads no model):

- `POST /v1/completions`: `prompt` -> `text_completion`;
- `POST /v1/chat/completions`: `messages` rendered in the chat template the trainer renders chat
  JSONL with (`<|role|>\\n{content}\\n` per message) plus the assistant's header `<|assistant|>\\n`;
  the reply ends where the model begins the next message (`\\n<|`, worker/inference.py);
- `POST /v1/models/{id}/generate`: our older shape (`text`, `usage`), the same path underneath.

`model` is any id of `GET /v1/models` (a fine-tuned model or a checkpoint); 404 `model_not_found`
otherwise. With `stream: true` the answer is Server-Sent Events in OpenAI's chunk shapes, each
`data: {json}\\n\\n`, then `data: [DONE]\\n\\n`; a failure after the stream began is one
`data: {"error": {...}}` event (what the openai SDK raises) and no [DONE].
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from api.completion_models import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    SamplingFields,
    Usage,
)
from api.deps import CurrentKey, SettingsDep
from api.errors import APIError, ErrorResponse
from api.inference import ClientGone, InferenceResult, InferenceRun, collect, start_inference
from api.logprob_shapes import chat_logprobs, completion_logprobs
from api.request_models import GenerateRequest
from api.request_text import json_router
from api.schemas import GenerateResponse
from api.stream_limits import holding, stream_limits
from core.models import ApiKey
from core.settings import Settings

Tokens = list[dict[str, Any]] | None  # a chunk's token records (api/inference.py take_tokens)
router = json_router(prefix="/v1", tags=["completions"])

# 200 is JSON, or SSE with stream: true; a `model` that names none of yours is a 404 (as OpenAI answers)
RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "`model` is none of your models or checkpoints"},
    200: {
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "string",
                    "description": "with stream: true, `data: {chunk}` events, then `data: [DONE]`",
                }
            }
        }
    },
}


def max_tokens_of(field: str, value: int | None, settings: Settings) -> int:
    """The tokens to generate at most: the request's, bounded by `max_completion_tokens`."""
    limit = settings.max_completion_tokens
    if value is None:
        return limit
    if value > limit:
        raise APIError(
            400,
            f"{field}: at most {limit} tokens can be generated per request (setting "
            f"FROMSCRATCH_MAX_COMPLETION_TOKENS); got {value}",
            param=field,
            code="invalid_value",
        )
    return value


def check_supported(body: SamplingFields) -> None:
    found = body.unsupported()
    if found is not None:
        field, message = found
        raise APIError(400, message, param=field, code="unsupported_parameter")


def usage_of(result: InferenceResult) -> Usage:
    return Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
    )


async def finished_text(run: InferenceRun, request: Request) -> tuple[str, InferenceResult]:
    try:
        return await collect(run, request.is_disconnected)
    except ClientGone as e:
        raise APIError(
            400, "The client went away before the completion was done.", code="request_aborted"
        ) from e


def event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


DONE = "data: [DONE]\n\n"
KEEPALIVE = ": keep-alive\n\n"  # an SSE comment while the worker is silent (loading the model)
DEFAULT_MAX_TOKENS = 16  # /v1/completions' max_tokens when not given, as OpenAI's


def event_stream(
    run: InferenceRun, events: AsyncGenerator[str, None], release: Callable[[], None]
) -> StreamingResponse:
    """The SSE answer: `events`, then the row is deleted (also when the client went away); the key's
    stream slot (api/stream_limits.py) is released at the end."""

    async def body() -> AsyncIterator[str]:
        try:
            async for item in events:
                yield item
        except ClientGone:
            return
        except APIError as e:
            yield event(e.body())
        finally:
            await events.aclose()
            await run.close()

    return StreamingResponse(
        holding(release, body()),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# ------------------------------------------------------------------------------------- completions
@router.post(
    "/completions",
    response_model=Completion,
    summary="Complete a prompt with one of your models (OpenAI's legacy completions)",
    responses=RESPONSES,
)
async def create_completion(
    body: CompletionRequest, request: Request, key: CurrentKey, settings: SettingsDep
) -> Response | Completion:
    check_supported(body)
    if body.max_tokens == 0 and not body.echo:
        raise APIError(
            400,
            "max_tokens: 0 generates nothing; it is allowed with echo: true only (scoring the prompt)",
            param="max_tokens",
            code="invalid_value",
        )
    params = {
        "prompt": body.prompt,
        # null reads as not given: OpenAI's default of 16
        "max_tokens": max_tokens_of(
            "max_tokens", DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens, settings
        ),
        "logprobs": body.logprobs,
        "echo": bool(body.echo),
        **body.sampling_params(),
    }
    run, release = await _start(request, key, bool(body.stream), body.model, params)
    cid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())

    def logprobs(tokens: list[dict[str, Any]]) -> dict[str, Any] | None:
        return None if body.logprobs is None else completion_logprobs(tokens)

    def chunk(text: str, finish_reason: str | None, tokens: Tokens = None) -> dict[str, Any]:
        choice = {
            "text": text,
            "index": 0,
            "logprobs": logprobs(tokens or []),
            "finish_reason": finish_reason,
        }
        data: dict[str, Any] = {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": body.model,
            "system_fingerprint": None,
            "choices": [choice],
        }
        if body.include_usage:
            data["usage"] = None
        return data

    if body.stream:
        return event_stream(run, _events(run, request, chunk, body.include_usage), release)
    text, result = await finished_text(run, request)
    choice = CompletionChoice(
        text=text,
        finish_reason=result.finish_reason,  # type: ignore[arg-type]
        logprobs=logprobs(run.take_tokens()),  # type: ignore[arg-type]
    )
    return Completion(id=cid, created=created, model=body.model, choices=[choice], usage=usage_of(result))


async def _start(
    request: Request, key: ApiKey, stream: bool, model: str, params: dict[str, Any]
) -> tuple[InferenceRun, Callable[[], None]]:
    """The inference run, and for a stream the key's stream slot (429 before anything is queued
    when the key has its limit open: api/stream_limits.py); its release does nothing otherwise."""
    release = stream_limits(request.app).reserve(key.id) if stream else (lambda: None)
    try:
        return await start_inference(request.app, key.owner_id, model, params), release
    except BaseException:
        release()
        raise


async def _events(
    run: InferenceRun,
    request: Request,
    chunk: Callable[[str, str | None, Tokens], dict[str, Any]],
    include_usage: bool,
    first: dict[str, Any] | None = None,
) -> AsyncGenerator[str, None]:
    """Chunks of the deltas, then one with the finish reason, the usage chunk, [DONE]. `chunk(text,
    finish_reason, tokens)` shapes one (tokens: the records of its tokens' logprobs, api/inference.py);
    `first` is sent before the text (chat: the role)."""
    if first is not None:
        yield event(first)
    async for delta in run.deltas(request.is_disconnected, run.settings.sse_keepalive_seconds):
        yield KEEPALIVE if delta is None else event(chunk(delta, None, run.take_tokens()))
    assert run.result is not None
    yield event(chunk("", run.result.finish_reason, run.take_tokens()))
    if include_usage:
        yield event({**chunk("", None, None), "choices": [], "usage": usage_of(run.result).model_dump()})
    yield DONE


# -------------------------------------------------------------------------------- chat completions
@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    summary="Answer a conversation with one of your models (OpenAI's chat completions)",
    responses=RESPONSES,
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, key: CurrentKey, settings: SettingsDep
) -> Response | ChatCompletion:
    check_supported(body)
    field, limit = body.limit()
    params = {
        "messages": [{"role": m.role, "content": m.content} for m in body.messages],
        "max_tokens": max_tokens_of(field, limit, settings),
        # not given: the reply may take what the model's context leaves after the prompt (OpenAI's)
        "fill_context": limit is None,
        "logprobs": (body.top_logprobs or 0) if body.logprobs else None,
        **body.sampling_params(),
    }
    run, release = await _start(request, key, bool(body.stream), body.model, params)
    cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())

    def logprobs(tokens: list[dict[str, Any]]) -> dict[str, Any] | None:
        return chat_logprobs(tokens) if body.logprobs else None

    def chunk(
        text: str, finish_reason: str | None, tokens: Tokens = None, delta: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        lp = None if delta is not None else logprobs(tokens or [])
        if delta is None:
            delta = {"content": text} if finish_reason is None else {}
        data: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": body.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}],
        }
        if body.include_usage:
            data["usage"] = None
        return data

    if body.stream:
        first = chunk("", None, delta={"role": "assistant", "content": ""})
        return event_stream(run, _events(run, request, chunk, body.include_usage, first), release)
    text, result = await finished_text(run, request)
    choice = ChatChoice(
        message=AssistantMessage(content=text),
        finish_reason=result.finish_reason,  # type: ignore[arg-type]
        logprobs=logprobs(run.take_tokens()),  # type: ignore[arg-type]
    )
    return ChatCompletion(id=cid, created=created, model=body.model, choices=[choice], usage=usage_of(result))


# ------------------------------------------------------------------------------ generate (ours)
@router.post(
    "/models/{model_id:path}/generate",
    response_model=GenerateResponse,
    summary="Generate text from a model or checkpoint (our shape; /v1/completions is OpenAI's)",
)
async def generate(
    model_id: str, body: GenerateRequest, request: Request, key: CurrentKey, settings: SettingsDep
) -> GenerateResponse:
    params = {
        "prompt": body.prompt,
        "max_tokens": max_tokens_of("max_tokens", body.max_tokens, settings),
        "temperature": body.temperature,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": [],
    }
    run = await start_inference(request.app, key.owner_id, model_id, params)
    text, result = await finished_text(run, request)
    usage = usage_of(result)
    return GenerateResponse(model=model_id, text=text, usage=usage.model_dump())
