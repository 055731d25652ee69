"""Tokenizers: a fixed byte-level one (default) and a trained byte-level BPE.

Both share one id layout so exports and samplers can rely on it:
    ids 0..255   the 256 single bytes, in byte order (byte b has id b)
    id  256      BOS "<s>"
    id  257      EOS "</s>"
    ids 258..    (BPE only) merged tokens, in merge order
Because id b is byte b in both, the newline byte is id 10 for either tokenizer.

`encode` never adds BOS/EOS and never turns the literal text "<s>" into a special token (user data
may contain it). `decode` drops BOS/EOS and turns invalid UTF-8 into U+FFFD. `token_bytes(id)` is
the raw bytes of one token (b"" for BOS/EOS), which exports need for their vocabularies.

The BPE wraps a Hugging Face `tokenizers.Tokenizer` (ByteLevel pre-tokenizer, add_prefix_space=False,
GPT-2 regex; ByteLevel decoder; no normaliser). Its vocabulary strings use GPT-2's byte-to-unicode
form. `to_json()` embeds the HF tokenizer JSON string verbatim, so it round-trips exactly and an
export can write it out as `tokenizer.json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # tokenizers (Hugging Face) is imported only when a BPE is built
    from tokenizers import Tokenizer as HFTokenizer

N_BYTES = 256
BOS_ID = 256
EOS_ID = 257
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN)
BASE_VOCAB = N_BYTES + len(SPECIAL_TOKENS)  # 258


@runtime_checkable
class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_bytes(self, id: int) -> bytes: ...
    def to_json(self) -> dict[str, Any]: ...


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what byte-level BPE vocabularies use).

    Printable latin-1 bytes map to themselves; the other 68 bytes (controls, space, 0x7F-0xA0, 0xAD)
    are moved, in byte order, to code points 256, 257, ... so no vocabulary string holds whitespace
    or control characters.
    """
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    mapping: dict[int, str] = {}
    shifted = 0
    for b in range(N_BYTES):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(N_BYTES + shifted)
            shifted += 1
    return mapping


@cache
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _decode_bytes(chunks: Iterable[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")


class ByteTokenizer:
    """Bytes 0..255 plus BOS/EOS: lossless for any input, vocab 258."""

    kind = "byte"
    vocab_size = BASE_VOCAB
    bos_id = BOS_ID
    eos_id = EOS_ID

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < N_BYTES).decode("utf-8", errors="replace")

    def token_bytes(self, id: int) -> bytes:
        if not 0 <= id < self.vocab_size:
            raise IndexError(f"token id {id} out of range for vocab_size {self.vocab_size}")
        return bytes([id]) if id < N_BYTES else b""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size}

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class BPETokenizer:
    """Byte-level BPE backed by a Hugging Face `tokenizers.Tokenizer`; build with `train_bpe`."""

    kind = "bpe"
    bos_id = BOS_ID
    eos_id = EOS_ID

    def __init__(self, hf_json: str):
        from tokenizers import Tokenizer as HFTokenizer

        self._hf_json = hf_json
        self._hf = HFTokenizer.from_str(hf_json)
        # Literal "<s>" in user text must stay text, never become BOS.
        self._hf.encode_special_tokens = True
        self.vocab_size = self._hf.get_vocab_size(with_added_tokens=True)
        u2b = unicode_to_bytes()
        table: list[bytes] = [b""] * self.vocab_size
        for token, idx in self._hf.get_vocab(with_added_tokens=True).items():
            if token in SPECIAL_TOKENS:
                continue
            table[idx] = bytes(u2b[c] for c in token)
        self._bytes = table
        self._check_layout()

    def _check_layout(self) -> None:
        b2u = bytes_to_unicode()
        for b in range(N_BYTES):
            if self._hf.token_to_id(b2u[b]) != b:
                raise ValueError(
                    f"BPE vocabulary does not have byte {b} at id {b}; not a fromscratch tokenizer"
                )
        if self._hf.token_to_id(BOS_TOKEN) != BOS_ID or self._hf.token_to_id(EOS_TOKEN) != EOS_ID:
            raise ValueError("BPE vocabulary does not have <s>=256 and </s>=257; not a fromscratch tokenizer")

    @property
    def hf_tokenizer(self) -> HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (exports write its JSON)."""
        return self._hf

    @property
    def merges(self) -> list[tuple[str, str]]:
        """Merges in priority order, as pairs of GPT-2 byte-to-unicode strings."""
        model = json.loads(self._hf_json)["model"]
        return _merge_pairs(model["merges"])

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode several texts at once (HF parallelises this in Rust)."""
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        # Done here rather than by HF so invalid UTF-8 handling matches ByteTokenizer exactly.
        table = self._bytes
        n = self.vocab_size
        return _decode_bytes(table[i] for i in map(int, ids) if 0 <= i < n)

    def token_bytes(self, id: int) -> bytes:
        if not 0 <= id < self.vocab_size:
            raise IndexError(f"token id {id} out of range for vocab_size {self.vocab_size}")
        return self._bytes[id]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "hf_tokenizer": self._hf_json}

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _build_hf_bpe(merges: Sequence[tuple[str, str]], max_vocab: int | None = None) -> str:
    """An HF tokenizer JSON string with our id layout: bytes, <s>, </s>, then one id per new merge.

    Merges are kept in rank order until `max_vocab` ids exist (a prefix of a merge list is valid BPE).
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab: dict[str, int] = {c: b for b, c in bytes_to_unicode().items()}
    vocab[BOS_TOKEN] = BOS_ID
    vocab[EOS_TOKEN] = EOS_ID
    kept: list[tuple[str, str]] = []
    for a, b in merges:
        merged = a + b
        # A merge may spell "<s>"/"</s>" (the bytes of that text): drop it, or text would decode
        # as a special token. Merges built on a dropped token go too (their parts no longer exist).
        if merged in SPECIAL_TOKENS or {a, b} & set(SPECIAL_TOKENS) or a not in vocab or b not in vocab:
            continue
        if merged not in vocab:
            if max_vocab is not None and len(vocab) >= max_vocab:
                break
            vocab[merged] = len(vocab)
        kept.append((a, b))
    model = models.BPE(vocab=vocab, merges=kept)
    hf = HFTokenizer(model)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(SPECIAL_TOKENS))  # reuse ids 256/257 already in the vocab
    return hf.to_str()


def train_bpe(vocab_size: int, texts: Iterable[str]) -> BPETokenizer:
    """Train a byte-level BPE with `vocab_size` ids in total (258 base ids + merges).

    Fewer ids result when the text has too few distinct pairs to merge. `texts` is read once, as a
    stream, and the BPE is trained on a bounded sample of it (trainer.data.text_sample: about 8 Mi
    characters at most, spread over the whole input; input of up to 4 Mi characters is used whole),
    so training on a 1 GiB file holds neither that file nor the word counts of all of it (about
    150 MB on text of two million distinct words; bench/README.md, issue 22).
    """
    if vocab_size < BASE_VOCAB + 1:
        raise ValueError(
            f"bpe vocab_size must be at least {BASE_VOCAB + 1} (256 bytes + <s>, </s> + merges), "
            f"got {vocab_size}"
        )
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    from trainer.data.text_sample import sample_texts

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # A small margin replaces merges that _build_hf_bpe may drop (ones spelling "<s>"/"</s>").
    margin = 8
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size + margin,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(sample_texts(texts), trainer)
    raw = json.loads(hf.to_str())["model"]["merges"]
    return BPETokenizer(_build_hf_bpe(_merge_pairs(raw), max_vocab=vocab_size))


def _merge_pairs(raw: list[str | list[str]]) -> list[tuple[str, str]]:
    """tokenizers' JSON stores a merge as "a b" (older) or ["a", "b"] (newer)."""
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in raw]
    return [(a, b) for a, b in pairs]


def train_tokenizer(kind: str, vocab_size: int | None, texts: Iterable[str]) -> Tokenizer:
    """`byte` ignores `texts` (its vocabulary is fixed; vocab_size must be None or 258);
    `bpe` trains on `texts` (default vocab_size 4096)."""
    if kind == "byte":
        if vocab_size not in (None, BASE_VOCAB):
            raise ValueError(
                f"the byte tokenizer has a fixed vocab_size of {BASE_VOCAB}, got {vocab_size}; "
                "use the bpe tokenizer for another size"
            )
        return ByteTokenizer()
    if kind == "bpe":
        return train_bpe(vocab_size or 4096, texts)
    raise ValueError(f"unknown tokenizer kind {kind!r}; expected 'byte' or 'bpe'")


def tokenizer_from_json(d: dict[str, Any]) -> Tokenizer:
    """Inverse of `Tokenizer.to_json()`."""
    kind = d.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        tok = BPETokenizer(d["hf_tokenizer"])
        if "vocab_size" in d and d["vocab_size"] != tok.vocab_size:
            raise ValueError(
                f"tokenizer JSON says vocab_size {d['vocab_size']} but its vocabulary has "
                f"{tok.vocab_size} ids"
            )
        return tok
    raise ValueError(f"unknown tokenizer kind {kind!r} in tokenizer JSON; expected 'byte' or 'bpe'")
