"""The bodies of `POST /v1/completions` and `POST /v1/chat/completions` and their answers, in OpenAI's
shapes (so the `openai` SDK sends and parses them unchanged).

Requests refuse unknown fields (400 "Unrecognized request argument", naming it). OpenAI's fields
this service does not implement are accepted at their default values only; any other value is a
400 naming the field (`unsupported()`, code `unsupported_parameter`): best_of > 1, suffix, and for
chat tools, response formats other than text, audio, functions, reasoning and the rest of
NOTHING_ASKED. logprobs (completions 0..5, chat top_logprobs
0..20 with logprobs true), echo and, with echo, max_tokens 0 (scoring only) work as OpenAI's
(api/logprob_shapes.py). A prompt is text or token ids, one per request. `n` must be 1.
presence_penalty, frequency_penalty and logit_bias work as OpenAI's (trainer.sampling.Penalties).
Token ids (a prompt's, logit_bias's) are checked against the model's vocabulary when the request
is queued (api/inference.py). `user`, `metadata`, `safety_identifier`, `prompt_cache_key`,
`prompt_cache_retention` and `service_tier` are accepted and ignored. `top_k` is our extension (OpenAI has none).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from api.completion_fields import (
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    FinishReason,
    LogitBias,
    Prompt,
    Role,
    Seed,
    Stop,
    text_content,
)
from api.logprob_shapes import ChatLogprobs, CompletionLogprobs
from api.request_models import INT64_MAX, MAX_PROMPT_CHARS


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = Field(None, description="send a last chunk with `usage` before [DONE]")
    include_obfuscation: bool | None = Field(None, description="accepted and ignored")


class SamplingFields(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=256, description="a fine-tuned model or checkpoint id")
    max_tokens: int | None = Field(
        None, ge=1, le=INT64_MAX, description="tokens to generate at most (the server bounds it)"
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 is greedy decoding (default 1)")
    top_p: float | None = Field(None, ge=0.0, le=1.0, description="nucleus sampling (default 1)")
    top_k: int | None = Field(
        None, ge=1, le=INT64_MAX, description="our extension: sample from the k likeliest"
    )
    n: int | None = Field(None, description="only 1 is supported (any other is a 400 saying so)")
    seed: Seed = None
    stop: Stop = None
    stream: bool | None = Field(None, description="answer Server-Sent Events, each a chunk of the completion")
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="subtracted from a token's logit once it was generated (default 0)"
    )
    frequency_penalty: float | None = Field(
        None,
        ge=-2.0,
        le=2.0,
        description="subtracted from a token's logit per time it was generated (default 0)",
    )
    logit_bias: LogitBias | None = Field(
        None,
        max_length=MAX_LOGIT_BIAS,
        description="token id (a string) -> a bias from -100 to 100 added to its logit",
    )
    user: str | None = Field(None, max_length=256, description="accepted and ignored")

    @field_validator("n")
    @classmethod
    def _only_one(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise PydanticCustomError("n_unsupported", "only n=1 is supported: one completion per request")
        return value

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) of the first OpenAI feature asked for that this service lacks."""
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return None

    def sampling_params(self) -> dict[str, Any]:
        """temperature, top_p, top_k, seed, stop and the penalties as the inference worker reads them
        (OpenAI's defaults filled in; a top_p of 0 keeps only the likeliest token: greedy)."""
        temperature = 1.0 if self.temperature is None else self.temperature
        top_p = None if self.top_p in (None, 1.0) else self.top_p
        if top_p == 0:
            temperature, top_p = 0.0, None
        return {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": [s for s in self.stop or [] if s],
            "frequency_penalty": self.frequency_penalty or 0.0,
            "presence_penalty": self.presence_penalty or 0.0,
            "logit_bias": {str(int(k)): v for k, v in (self.logit_bias or {}).items()},
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"model": "ft:llama-tiny:abc123", "prompt": "ROMEO:", "max_tokens": 32}]
        },
    )

    prompt: Prompt = ""
    max_tokens: int | None = Field(
        16, ge=0, le=INT64_MAX, description="tokens to generate at most (default 16; 0 only with echo)"
    )
    logprobs: int | None = Field(
        None, ge=0, le=5, description="the tokens' logprobs, and this many likeliest tokens at each position"
    )
    echo: bool | None = Field(None, description="the prompt before the completion (with its logprobs)")
    best_of: int | None = Field(None, ge=1, le=20, description="only 1 is supported")
    suffix: str | None = Field(None, max_length=MAX_PROMPT_CHARS, description="not supported: leave out")

    def unsupported(self) -> tuple[str, str] | None:
        if self.best_of not in (None, 1):
            return "best_of", "best_of is not supported: leave it out or 1"
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported: leave it out"
        return super().unsupported()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Role
    content: Annotated[
        str,
        BeforeValidator(text_content),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "string", "maxLength": MAX_PROMPT_CHARS},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                            "required": ["type", "text"],
                        },
                    },
                ]
            }
        ),
    ] = Field(max_length=MAX_PROMPT_CHARS)
    name: str | None = Field(None, max_length=256, description="accepted and ignored")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: str = Field(max_length=64)


# OpenAI chat fields of features this service lacks -> the value that asks for nothing (None: only null)
NOTHING_ASKED: dict[str, Any] = {
    "audio": None,
    "functions": [],
    "function_call": "none",
    "modalities": ["text"],
    "prediction": None,
    "reasoning_effort": None,
    "verbosity": None,
    "web_search_options": None,
}


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"model": "ft:llama-tiny:abc123", "messages": [{"role": "user", "content": "Hello"}]}
            ]
        },
    )

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(
        None,
        ge=1,
        le=INT64_MAX,
        description="tokens to generate at most (max_tokens is the older name); when neither is given, "
        "what the model's context leaves after the prompt, at most the server's bound",
    )
    logprobs: bool | None = Field(None, description="the logprobs of the reply's tokens")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="with logprobs, the likeliest tokens at each position"
    )
    response_format: ResponseFormat | None = Field(None, description='only {"type": "text"} is supported')
    tools: list[dict[str, Any]] | None = Field(
        None, max_length=128, description="not supported: leave out or []"
    )
    tool_choice: Any = Field(None, description='only "none" is supported')
    parallel_tool_calls: bool | None = Field(None, description="accepted and ignored (no tools)")
    store: bool | None = Field(None, description="only false is supported (nothing is stored)")
    metadata: dict[str, str] | None = Field(None, max_length=16, description="accepted and ignored")
    # OpenAI's hints about the caller and its caching/billing: nothing here acts on them
    safety_identifier: str | None = Field(None, max_length=256, description="accepted and ignored")
    prompt_cache_key: str | None = Field(None, max_length=1024, description="accepted and ignored")
    prompt_cache_retention: str | None = Field(None, max_length=64, description="accepted and ignored")
    service_tier: str | None = Field(None, max_length=64, description="accepted and ignored")
    # OpenAI's features this service lacks: null (how the SDK sends a None the caller passed) or a
    # value asking for nothing is accepted (NOTHING_ASKED); any other is a 400 naming the field
    audio: Any = Field(None, description="not supported: null only")
    functions: Any = Field(None, description="not supported: null or []")
    function_call: Any = Field(None, description='not supported: null or "none"')
    modalities: Any = Field(None, description='only ["text"] (or null)')
    prediction: Any = Field(None, description="not supported: null only")
    reasoning_effort: Any = Field(None, description="not supported: null only")
    verbosity: Any = Field(None, description="not supported: null only")
    web_search_options: Any = Field(None, description="not supported: null only")

    @field_validator("messages")
    @classmethod
    def _bounded(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        total = sum(len(m.content) for m in messages)
        if total > MAX_PROMPT_CHARS:
            raise PydanticCustomError(
                "messages_too_long",
                "the messages hold {total} characters of content; at most {limit} are accepted",
                {"total": total, "limit": MAX_PROMPT_CHARS},
            )
        return messages

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        if self.response_format is not None and self.response_format.type != "text":
            return "response_format", 'only response_format {"type": "text"} is supported'
        if self.tools:
            return "tools", "tools are not supported: leave them out"
        if self.tool_choice not in (None, "none"):
            return "tool_choice", "tool_choice is not supported: leave it out or none"
        if self.store:
            return "store", "store is not supported: leave it out or false"
        for name, nothing in NOTHING_ASKED.items():
            value = getattr(self, name)
            if value is not None and value != nothing:
                return name, f"{name} is not supported: leave it out" + (
                    f" or {json.dumps(nothing)}" if nothing else ""
                )
        return super().unsupported()

    def limit(self) -> tuple[str, int | None]:
        """(the field that bounds the reply, its value): max_completion_tokens wins over max_tokens."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


# ------------------------------------------------------------------------------------------ answers
class Usage(BaseModel):
    prompt_tokens: int = Field(description="tokens of the prompt as the model's tokenizer encodes it")
    completion_tokens: int = Field(description="tokens generated")
    total_tokens: int


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = Field(description="stop: EOS or a stop sequence; length: max_tokens")


class Completion(BaseModel):
    """A text completion (a chunk of one when streamed: same shape, `usage` only in the last)."""

    id: str = Field(description="cmpl-...")
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str = Field(description="chatcmpl-...")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage
