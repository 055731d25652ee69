"""OpenAI's `logprobs` objects, made from the token records the inference worker writes
(worker/token_logprobs.py: {"b": hex bytes, "s": special name, "l": logprob, "o"/"e": offsets in the
text, "top": [[hex bytes, logprob, special name], ...]}).

- legacy completions: {tokens, token_logprobs, top_logprobs, text_offset}; top_logprobs holds, per
  token, a dict token -> logprob of the `logprobs` likeliest and the token itself where it is not
  one of them (OpenAI's "up to logprobs+1 elements"; with `logprobs` 0 the token alone), null for an
  echoed prompt's first token, which has nothing before it;
- chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal: null}.

A token's string is its bytes as UTF-8; bytes that are not whole UTF-8 characters (a byte-level
token that is part of one) are written as OpenAI writes them, `bytes:\\xe2\\x80`. BOS and EOS,
which have no bytes, are named `<s>` and `</s>`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(description="the tokens, as text")
    token_logprobs: list[float | None] = Field(description="each token's logprob (null: nothing before it)")
    top_logprobs: list[dict[str, float] | None] | None = Field(
        description="per token, the `logprobs` likeliest tokens there and the token itself -> their logprobs"
    )
    text_offset: list[int] = Field(description="where each token's text begins in `text`")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


def token_text(hex_bytes: str, special: str | None) -> str:
    if special:
        return special
    raw = bytes.fromhex(hex_bytes)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def token_bytes(hex_bytes: str, special: str | None) -> list[int]:
    return list(special.encode() if special else bytes.fromhex(hex_bytes))


def completion_logprobs(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The legacy shape of `records`."""
    tops: list[dict[str, float] | None] = []
    for record in records:
        if record["top"] is None:
            tops.append(None)
            continue
        listed: dict[str, float] = {}
        for hex_bytes, logprob, special in [*record["top"], [record["b"], record["l"], record["s"]]]:
            listed.setdefault(token_text(hex_bytes, special), logprob)  # the likelier of two alike
        tops.append(listed)
    return {
        "tokens": [token_text(r["b"], r["s"]) for r in records],
        "token_logprobs": [r["l"] for r in records],
        "top_logprobs": tops,
        "text_offset": [r["o"] for r in records],
    }


def chat_logprobs(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat shape of `records`."""
    content = []
    for record in records:
        content.append(
            {
                "token": token_text(record["b"], record["s"]),
                "logprob": record["l"],
                "bytes": token_bytes(record["b"], record["s"]),
                "top_logprobs": [
                    {"token": token_text(b, s), "logprob": lp, "bytes": token_bytes(b, s)}
                    for b, lp, s in record["top"] or []
                ],
            }
        )
    return {"content": content, "refusal": None}
