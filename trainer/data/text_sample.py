"""A bounded sample of a text stream, for training a BPE tokenizer on a file of any size.

Why: Hugging Face's `train_from_iterator` counts the words of everything it is given, and its
Python binding reads the iterator ahead (a few hundred items at a time); on a 1 GiB upload that is
hundreds of MB of text in flight and a word table that grows with the file. A tokenizer of at most
65,536 ids does not need 1 GiB of text, so BPE training reads a sample instead, held in memory:

- the texts are cut into pieces of at most `piece_chars` characters, at the points where byte-level
  (GPT-2 regex) pre-tokenization splits anyway (trainer.data.formats.split_point), so a piece never
  splits a word the whole text would have kept;
- the pieces are packed, in order, into groups of at least `piece_chars` characters (one piece
  longer than that is its own group), and a reservoir keeps a uniformly random set of those groups
  (seeded: the same input always gives the same sample), handed back in input order;
- the reservoir holds `max_chars // (2 * piece_chars) + 1` groups of fewer than `2 * piece_chars`
  characters each: about `max_chars` characters at most, whatever the input's size. Input of at
  most `max_chars // 2` characters is kept whole (and so trains the very tokenizer the whole input
  would have trained).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from trainer.data.formats import split_point

SAMPLE_CHARS = 8 << 20  # about 8 Mi characters of text at most (inputs up to 4 Mi kept whole)
PIECE_CHARS = 1 << 16


def pieces(text: str, piece_chars: int = PIECE_CHARS) -> Iterator[str]:
    """`text` in pieces of at most `piece_chars` characters, cut at pre-tokenization boundaries (a
    run of that many characters without one is cut where it reaches the limit)."""
    start = 0
    while len(text) - start > piece_chars:
        cut = split_point(text[start : start + piece_chars + 1]) or piece_chars
        yield text[start : start + cut]
        start += cut
    if start < len(text):
        yield text[start:]


def _groups(texts: Iterable[str], piece_chars: int) -> Iterator[list[str]]:
    group: list[str] = []
    size = 0
    for text in texts:
        for piece in pieces(text, piece_chars):
            group.append(piece)
            size += len(piece)
            if size >= piece_chars:
                yield group
                group, size = [], 0
    if group:
        yield group


def sample_texts(
    texts: Iterable[str], max_chars: int = SAMPLE_CHARS, piece_chars: int = PIECE_CHARS, seed: int = 0
) -> list[str]:
    """A sample of about `max_chars` characters at most of `texts`, spread over all of it, in input
    order (see the module docstring)."""
    slots = max_chars // (2 * piece_chars) + 1
    rng = random.Random(seed)
    kept: list[tuple[int, list[str]]] = []
    for i, group in enumerate(_groups(texts, piece_chars)):
        if i < slots:
            kept.append((i, group))
            continue
        j = rng.randrange(i + 1)
        if j < slots:
            kept[j] = (i, group)
    kept.sort(key=lambda item: item[0])
    return [piece for _, group in kept for piece in group]
