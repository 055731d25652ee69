"""The per-token logprobs an inference worker writes beside the text, when a request asks for them
(`params.logprobs`: how many of the likeliest tokens to list at each position, 0 for none).

Each reported token is one JSON line appended to the row's `token_logprobs` in the same UPDATE as
the text it belongs to: {"b": its bytes in hex, "s": the name of a special token (BOS/EOS, which
have no bytes), "l": its logprob (null: the first token of an echoed prompt, which has nothing before
it), "o"/"e": where its text begins and ends in the row's `output` (characters), "top": [[hex bytes,
logprob, special name or null], ...] (null with nothing before it)}. The API formats them in
OpenAI's shapes (api/logprob_shapes.py).

A token is reported once the text it ends in is final (`output` covers it), and not at all when a
stop sequence (or a chat reply's dropped trailing newline) took the text it begins in: the tokens
match the text returned.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.data.tokenizers import BOS_TOKEN, EOS_TOKEN

if TYPE_CHECKING:
    from trainer.data.tokenizers import Tokenizer
    from trainer.logprobs import LogprobRecorder, TokenLogprob
    from trainer.text_stream import TextStream


class PromptTooLong(Exception):
    """An echoed prompt to score is longer than the model's context (its scores would be wrong)."""


def special_name(tokenizer: Tokenizer, token: int) -> str | None:
    if token == tokenizer.bos_id:
        return BOS_TOKEN
    if token == tokenizer.eos_id:
        return EOS_TOKEN
    return None


def entry(tokenizer: Tokenizer, token: int, rec: TokenLogprob | None, start: int, end: int) -> dict[str, Any]:
    top = None
    if rec is not None:
        top = [[tokenizer.token_bytes(i).hex(), lp, special_name(tokenizer, i)] for i, lp in rec.top]
    return {
        "b": tokenizer.token_bytes(token).hex(),
        "s": special_name(tokenizer, token),
        "l": None if rec is None else rec.logprob,
        "o": start,
        "e": end,
        "top": top,
    }


def lines(entries: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries)


def own_start(tokenizer: Tokenizer, token: int, start: int, end: int) -> int:
    """Where a token's text begins, given the characters its bytes decoded to in the stream
    (`start`..`end`): after any replacement characters that came first, for bytes an earlier token
    left incomplete and this one's showed to be no character (b"\xc3" then b"a": "\ufffda")."""
    own = len(codecs.getincrementaldecoder("utf-8")(errors="replace").decode(tokenizer.token_bytes(token)))
    return start + max(0, end - start - own)


def prompt_entries(
    tokenizer: Tokenizer, ids: Sequence[int], scores: Sequence[TokenLogprob | None]
) -> list[dict[str, Any]]:
    """The echoed prompt's tokens, their offsets those of the prompt's characters."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    found, at = [], 0
    for token, rec in zip(ids, scores, strict=True):
        start = at
        at += len(decoder.decode(tokenizer.token_bytes(token)))
        found.append(entry(tokenizer, token, rec, own_start(tokenizer, token, start, at), at))
    return found


@dataclass
class _Pending:
    token: int
    rec: TokenLogprob
    start: int
    end: int


class TokenTracker:
    """Generated tokens, with their records popped from `recorder`, waiting until the text they end
    in is final; offsets shifted by `base` (the echoed prompt's length)."""

    def __init__(self, tokenizer: Tokenizer, base: int, recorder: LogprobRecorder, report_eos: bool) -> None:
        self.tokenizer, self.base, self.recorder, self.report_eos = tokenizer, base, recorder, report_eos
        self.pending: list[_Pending] = []

    def add(self, token: int, start: int, end: int) -> None:
        start = own_start(self.tokenizer, token, start, end)
        self.pending.append(_Pending(token, self.recorder.pop(), start, end))

    def add_eos(self, at: int) -> None:
        """The EOS the model ended on (the decoding loop does not yield it), with no text at `at`:
        reported where `report_eos` (legacy completions, as OpenAI's and vLLM's), else left out."""
        if self.report_eos:
            self.pending.append(_Pending(self.tokenizer.eos_id, self.recorder.pop(), at, at))

    def ready(self, published: int) -> list[dict[str, Any]]:
        """The tokens whose text is all published, in order."""
        n = 0
        while n < len(self.pending) and self.pending[n].end <= published:
            n += 1
        return self._take(n)

    def rest(self, text: TextStream) -> list[dict[str, Any]]:
        """At the end: all that is left, but those a stop sequence or a dropped trailing text took."""
        if text.published >= text.decoded:
            return self._take(len(self.pending))
        return self._take(sum(1 for p in self.pending if p.start < text.published))

    def _take(self, n: int) -> list[dict[str, Any]]:
        taken, self.pending = self.pending[:n], self.pending[n:]
        return [entry(self.tokenizer, p.token, p.rec, self.base + p.start, self.base + p.end) for p in taken]
