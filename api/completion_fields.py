"""The field types of `POST /v1/completions` and `POST /v1/chat/completions` (api/completion_models.py):
a prompt (text or token ids, one per request), stop sequences, logit_bias, a seed, a message's
content and role; each checked whole by its validator, so a bad value gets one message naming it."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from api.request_models import INT32_MAX, INT64_MIN, MAX_PROMPT_CHARS, MAX_PROMPT_TOKENS
from trainer.data.chat import CHAT_ROLES, ROLE_ALIASES, ChatRole, canonical_role

MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
MAX_MESSAGES = 1024
MAX_LOGIT_BIAS = 300  # entries, OpenAI's own limit
FinishReason = Literal["stop", "length"]


def _one_prompt(value: Any) -> Any:
    """OpenAI takes a prompt or a batch of them, each text or token ids; one prompt is served here:
    a string or a list of token ids, alone or in a list of one. Checked whole here, so that a bad
    one gets one message rather than one per shape it failed."""
    if isinstance(value, list) and value and all(isinstance(x, (str, list)) for x in value):
        if len(value) > 1:
            raise PydanticCustomError(
                "prompt_batch",
                "a batch of {n} prompts: one prompt per request here; send them one at a time, "
                "several at once if need be (lm-evaluation-harness: batch_size=1, num_concurrent)",
                {"n": len(value)},
            )
        value = value[0]
    if isinstance(value, str):
        if len(value) > MAX_PROMPT_CHARS:
            raise PydanticCustomError(
                "prompt_length", "at most {limit} characters", {"limit": f"{MAX_PROMPT_CHARS:,}"}
            )
        return value
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        raise PydanticCustomError(
            "prompt_batch",
            "expected a string or a list of token ids (or a list of exactly one of either): "
            "one prompt per request here",
        )
    if len(value) > MAX_PROMPT_TOKENS:
        raise PydanticCustomError(
            "prompt_length", "at most {limit} token ids", {"limit": f"{MAX_PROMPT_TOKENS:,}"}
        )
    if any(not 0 <= x <= INT32_MAX for x in value):
        raise PydanticCustomError("token_id", "token ids are integers from 0 to the vocabulary's size - 1")
    return value


def _stop_list(value: Any) -> Any:
    """`stop`: a string or a list of up to MAX_STOP_SEQUENCES strings; always a list here."""
    if isinstance(value, str):
        return [value]
    return value


def text_content(value: Any) -> Any:
    """A message's content: a string, or a list of text parts ({"type": "text", "text": ...})."""
    if isinstance(value, list):
        texts = []
        for part in value:
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise PydanticCustomError(
                    "content_parts", 'expected a string or a list of {"type": "text", "text": string} parts'
                )
            texts.append(part["text"])
        return "".join(texts)
    return value


# The documents say what is accepted before the validators above normalise it
_PROMPT_TEXT = {"type": "string", "maxLength": MAX_PROMPT_CHARS}
_PROMPT_IDS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
    "maxItems": MAX_PROMPT_TOKENS,
}
Prompt = Annotated[
    str | list[int],
    BeforeValidator(_one_prompt),
    WithJsonSchema(
        {
            "anyOf": [
                _PROMPT_TEXT,
                _PROMPT_IDS,
                {
                    "type": "array",
                    "items": {"anyOf": [_PROMPT_TEXT, _PROMPT_IDS]},
                    "minItems": 1,
                    "maxItems": 1,
                },
            ],
            "description": "the text to continue, or its token ids in the model's tokenizer (one prompt; "
            "a list holding one is accepted too)",
        }
    ),
]
StopList = Annotated[
    list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOP_SEQUENCES)
]
Stop = Annotated[
    StopList | None,
    BeforeValidator(_stop_list),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "maxLength": MAX_STOP_CHARS},
                {
                    "type": "array",
                    "items": {"type": "string", "maxLength": MAX_STOP_CHARS},
                    "maxItems": MAX_STOP_SEQUENCES,
                },
                {"type": "null"},
            ],
        }
    ),
    Field(description="up to 4 sequences where generation stops; the text returned does not contain them"),
]
TOKEN_ID = re.compile(r"[0-9]{1,9}")


def _token_ids(value: Any) -> Any:
    """logit_bias's keys are token ids as decimal strings (JSON keys), said so when one is not."""
    if isinstance(value, dict):
        for key in value:
            if not (isinstance(key, str) and TOKEN_ID.fullmatch(key)):
                raise PydanticCustomError(
                    "token_id",
                    'keys must be token ids as decimal strings, such as "42"; got {key}',
                    {"key": key[:40]},
                )
    return value


# OpenAI's logit_bias: token id -> a bias in [-100, 100] added to its logit
LogitBias = Annotated[
    dict[Annotated[str, Field(pattern=TOKEN_ID.pattern)], Annotated[float, Field(ge=-100.0, le=100.0)]],
    BeforeValidator(_token_ids),
]
Seed = Annotated[
    int | None, Field(ge=INT64_MIN, le=2**64 - 1, description="the same seed gives the same text")
]


def _canonical_role(value: Any) -> Any:
    """OpenAI's `developer` is its newer `system`: the role the model was trained on (as in its data)."""
    return canonical_role(value) if isinstance(value, str) else value


Role = Annotated[
    ChatRole,
    BeforeValidator(_canonical_role),
    WithJsonSchema({"enum": [*CHAT_ROLES, *ROLE_ALIASES], "type": "string"}),
]
