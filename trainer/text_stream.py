"""Generated token bytes -> text that is final, for a completion streamed as it is generated.

Pure (no torch, no database), so it is tested on its own (tests/trainer/test_text_stream.py).

Two things make the newest text not final yet:
- a byte-level token can end inside a UTF-8 character (a BPE token, or one byte of ByteTokenizer):
  its bytes are kept until the character is complete. Bytes that can never form a character
  become U+FFFD, as `Tokenizer.decode` does, so the streamed text is exactly the decoded text;
- the text could be the beginning of a stop sequence: the longest tail of it that is a prefix of
  one is held back until the next tokens tell. When a stop sequence appears, the text before it
  is the output and the stop sequence itself is not.
`trailing` is text an end at EOS drops (a chat reply's "\n": the template's separator before the
next message, which EOS stands for); a reply cut short by max_tokens keeps it. What `push` and `finish` return is never taken
back, so it can be published at once. A NUL
character becomes U+FFFD as well: no text of this service holds one (PostgreSQL text cannot).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stops: Sequence[str] = (), trailing: str = "") -> None:
        self.stops = [s for s in stops if s]
        self.trailing = trailing
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet published: a possible beginning of a stop sequence
        self.stopped = False  # a stop sequence was found: nothing more is published
        self.decoded = 0  # characters decoded so far, published or not (a token's text ends here)
        self.published = 0  # characters returned so far

    def push(self, data: bytes) -> str:
        """Add the bytes of one generated token; returns the text that became final."""
        if self.stopped:
            return ""
        return self._release(self._decoder.decode(data), final=False)

    def finish(self, at_eos: bool = True) -> str:
        """Generation ended: the rest of the text (incomplete UTF-8 at the end becomes U+FFFD).
        `at_eos`: it ended on EOS, which `trailing` stands before; cut short (max_tokens, a time
        limit), the text is kept whole."""
        if self.stopped:
            return ""
        return self._release(self._decoder.decode(b"", final=True), final=True, at_eos=at_eos)

    def _release(self, text: str, final: bool, at_eos: bool = False) -> str:
        self.decoded += len(text)
        out = self._cut(text, final, at_eos)
        self.published += len(out)
        return out

    def _cut(self, text: str, final: bool, at_eos: bool) -> str:
        pending = self._pending + text.replace("\x00", "\ufffd")
        cut = first_stop(pending, self.stops)
        if cut is not None:
            self.stopped = True
            self._pending = ""
            return pending[:cut]
        if final and at_eos and self.trailing and pending.endswith(self.trailing):
            pending = pending[: -len(self.trailing)]
        keep = 0 if final else held_tail(pending, self.stops)
        self._pending = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop sequence in `text` begins (None when there is none)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def held_tail(text: str, stops: Sequence[str]) -> int:
    """The length of the longest tail of `text` that is a proper prefix of a stop sequence: the
    stop sequence may still be completed by what comes next, so that tail is not final yet."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
