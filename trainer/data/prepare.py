"""Data pipeline: documents -> token file (numpy memmap) -> train/val split -> batches.

- `tokenize_to_file` streams a text/JSONL file (see `trainer.data.formats`) through a tokenizer into a
  raw little-endian uint16 array (uint32 when vocab_size > 65535), written atomically. JSONL documents
  are each followed by EOS; plain text gets no BOS/EOS. Each segment of a JSONL document (its
  prompt part, its completion, see trainer.data.records) is tokenized on its own, and the tokens the loss
  covers are written beside the tokens as loss spans (`<tokens>.spans`, trainer.data.spans), only when
  some token is not covered (plain text and `{"text"}` records: no file, every token is trained).
- `prepare_data` validates, tokenizes (cached by file sha256 + tokenizer hash when `cache_dir` is
  given) and splits off the last `val_fraction` of tokens, or uses a separate validation file;
  `TokenData` carries the loss spans of both parts.
- `BatchSampler` (trainer.data.batches, re-exported here) draws the (x, y) batches.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from trainer.config.estimate import held_out_tokens
from trainer.data.batches import BatchSampler as BatchSampler  # re-exported: callers import it from here
from trainer.data.formats import (
    DEFAULT_CHUNK_CHARS,
    DataError,
    Document,
    detect_format,
    file_sha256,
    iter_jsonl_documents,
    iter_text_chunks,
    validate_file,
)
from trainer.data.spans import SPAN_DTYPE, covers_all, empty_spans, merge_spans, split_spans
from trainer.data.text_sample import pieces
from trainer.data.tokenizers import ByteTokenizer, Tokenizer

# Bump when the token-file layout or document rendering changes, so old caches are not reused.
# 2: JSONL segments tokenized on their own, loss spans beside the tokens.
# 3: text chunks no longer cut after a run of whitespace (BPE tokens of the chunks = the whole text's).
CACHE_VERSION = 3
ENCODE_CHARS = 1 << 16  # characters given to a BPE at once (see _encode)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def _encode(tokenizer: Tokenizer, text: str, dtype: np.dtype) -> np.ndarray:
    """The text's ids. A BPE gets it in pieces of ENCODE_CHARS cut where pre-tokenization splits
    anyway (same ids): Hugging Face keeps ~100 bytes of bookkeeping per token of the text it is
    given (offsets, token strings), ~180 MB for a 1 MB chunk, a few MB for a piece."""
    if type(tokenizer) is ByteTokenizer:  # fast path: the UTF-8 bytes are the ids
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(dtype)
    parts = [np.asarray(tokenizer.encode(piece), dtype=dtype) for piece in pieces(text, ENCODE_CHARS)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def _encode_all(tokenizer: Tokenizer, texts: list[str], dtype: np.dtype) -> list[np.ndarray]:
    """Each text's ids; with `encode_batch` (a BPE) in batches of about ENCODE_CHARS characters."""
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is None:
        return [_encode(tokenizer, text, dtype) for text in texts]
    out: list[np.ndarray] = []
    batch: list[str] = []
    size = 0
    for text in [*texts, None]:  # None: the end, flush
        if batch and (text is None or len(text) > ENCODE_CHARS or size + len(text) > ENCODE_CHARS):
            out.extend(np.asarray(ids, dtype=dtype) for ids in encode_batch(batch))
            batch, size = [], 0
        if text is not None and len(text) > ENCODE_CHARS:
            out.append(_encode(tokenizer, text, dtype))
        elif text is not None:
            batch.append(text)
            size += len(text)
    return out


def iter_token_chunks(
    path: str | os.PathLike[str], tokenizer: Tokenizer, chunk_chars: int = DEFAULT_CHUNK_CHARS
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """(tokens, loss spans within them) for a data file, about `chunk_chars` characters of input at a
    time; plain text has no spans (None: every token is trained)."""
    dtype = token_dtype(tokenizer.vocab_size)
    if detect_format(path) == "text":
        for chunk in iter_text_chunks(path, chunk_chars):
            yield _encode(tokenizer, chunk, dtype), None
        return
    batch: list[Document] = []
    size = 0
    with open(path, encoding="utf-8", newline="\n") as f:
        for doc in iter_jsonl_documents(f):
            batch.append(doc)
            size += sum(len(text) for text, _ in doc.segments)
            if size >= chunk_chars:
                yield _tokenize_documents(batch, tokenizer, dtype)
                batch, size = [], 0
    if batch:
        yield _tokenize_documents(batch, tokenizer, dtype)


def _tokenize_documents(
    docs: list[Document], tokenizer: Tokenizer, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The documents' tokens, each segment tokenized on its own and every document followed by EOS,
    and the spans of the trained segments (and EOS)."""
    arrays = _encode_all(tokenizer, [text for doc in docs for text, _ in doc.segments], dtype)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    pieces: list[np.ndarray] = []
    trained: list[bool] = []
    it = iter(arrays)
    for doc in docs:  # one entry per segment, not per token
        for (_, flag), arr in zip(doc.segments, it, strict=False):
            pieces.append(arr)
            trained.append(flag)
        pieces.append(eos)
        trained.append(doc.eos_trained)
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    ends = np.cumsum(lengths)
    keep = np.asarray(trained, dtype=bool)
    spans = np.stack([(ends - lengths)[keep], ends[keep]], axis=1)
    return np.concatenate(pieces), merge_spans(spans)


def spans_path(tokens_path: str | os.PathLike[str]) -> Path:
    """Where the loss spans of a token file live (absent: every token is trained)."""
    return Path(f"{os.fspath(tokens_path)}.spans")


class _SpanWriter:
    """Loss spans appended to a file as the chunks come, merged across chunk boundaries: the last
    span seen is held back until the next chunk shows whether it goes on. Holds one chunk's spans,
    never the file's."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.held: np.ndarray | None = None  # (1, 2): the last span, not written yet
        self.written = 0  # spans written so far
        self.first: tuple[int, int] | None = None

    def add(self, spans: np.ndarray) -> None:
        """Spans (merged, in file positions) that start at or after every span added before."""
        if len(spans) == 0:
            return
        if self.held is not None:
            spans = merge_spans(np.concatenate([self.held, spans]))
        self._write(spans[:-1])
        self.held = spans[-1:].copy()

    def finish(self) -> None:
        if self.held is not None:
            self._write(self.held)
            self.held = None

    def covers_all(self, n: int) -> bool:
        """Whether the spans written cover every one of the n tokens (call after finish)."""
        if n == 0:
            return True
        return self.written == 1 and self.first is not None and self.first[0] <= 0 and self.first[1] >= n

    def _write(self, spans: np.ndarray) -> None:
        if len(spans) == 0:
            return
        if self.first is None:
            self.first = (int(spans[0, 0]), int(spans[0, 1]))
        spans.astype(SPAN_DTYPE, copy=False).tofile(self.f)
        self.written += len(spans)


def tokenize_to_file(
    path: str | os.PathLike[str],
    tokenizer: Tokenizer,
    out_path: str | os.PathLike[str],
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
) -> int:
    """Tokenize `path` into a raw token array at `out_path` (written to a temp file, then renamed),
    and its loss spans (when some token is not trained) at spans_path(out_path), renamed first so
    the token file's presence means both are complete. Returns the number of tokens. Both are
    written chunk by chunk: memory holds one chunk's tokens and spans, whatever the file's size."""
    out_path = Path(out_path)
    tmp = out_path.with_name(f"{out_path.name}.tmp-{os.getpid()}")
    span_file = spans_path(out_path)
    span_tmp = span_file.with_name(f"{span_file.name}.tmp-{os.getpid()}")
    n = 0
    masked = False
    try:
        with open(tmp, "wb") as f, open(span_tmp, "wb") as sf:
            spans_out = _SpanWriter(sf)
            for arr, spans in iter_token_chunks(path, tokenizer, chunk_chars):
                arr.astype(arr.dtype.newbyteorder("<"), copy=False).tofile(f)
                if spans is not None:
                    masked = True
                    spans_out.add(spans + n)
                n += len(arr)
            spans_out.finish()
            for out in (f, sf):
                out.flush()
                os.fsync(out.fileno())
        if masked and not spans_out.covers_all(n):
            os.replace(span_tmp, span_file)
        else:
            span_tmp.unlink()
            span_file.unlink(missing_ok=True)
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        span_tmp.unlink(missing_ok=True)
        raise
    return n


def load_spans(tokens_path: str | os.PathLike[str]) -> np.ndarray | None:
    """The loss spans written beside a token file (a read-only memmap), or None (every token is
    trained)."""
    path = spans_path(tokens_path)
    if not path.exists():
        return None
    size = path.stat().st_size
    if size % (2 * SPAN_DTYPE.itemsize):
        raise DataError(f"loss span file {path} has {size} bytes, not a whole number of spans; it is corrupt")
    if size == 0:
        return empty_spans()
    return np.memmap(path, dtype=SPAN_DTYPE, mode="r").reshape(-1, 2)


def load_tokens(path: str | os.PathLike[str], vocab_size: int) -> np.ndarray:
    """A token file as a read-only memmap (an empty array for an empty file)."""
    dtype = token_dtype(vocab_size).newbyteorder("<")
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise DataError(
            f"token file {path} has {size} bytes, not a whole number of {dtype} tokens; "
            "it is corrupt or was written for another vocab_size"
        )
    if size == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


@dataclass
class TokenData:
    """Training and validation tokens, with their loss spans (trainer.data.spans; None: every token)."""

    train: np.ndarray
    val: np.ndarray | None
    train_spans: np.ndarray | None = None
    val_spans: np.ndarray | None = None
    held_out: bool = False  # `val` is the training file's last val_fraction (no validation file)


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(json.dumps(tokenizer.to_json(), sort_keys=True).encode()).hexdigest()


def tokenize_file(
    path: str | os.PathLike[str], tokenizer: Tokenizer, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate and tokenize one file: (tokens, loss spans), the tokens a memmap from the cache when
    `cache_dir` is given, else in memory."""
    if cache_dir is not None:
        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        key = f"{file_sha256(path)[:32]}-{tokenizer_hash(tokenizer)[:16]}-v{CACHE_VERSION}"
        out = cache_dir / f"{key}.tokens"
        if out.exists():  # used now: a service worker's cache sweep leaves recently used entries
            for used in (out, spans_path(out)):
                with contextlib.suppress(FileNotFoundError):
                    os.utime(used)
        else:
            validate_file(path)
            tokenize_to_file(path, tokenizer, out)
        return load_tokens(out, tokenizer.vocab_size), load_spans(out)
    validate_file(path)
    chunks = list(iter_token_chunks(path, tokenizer))
    dtype = token_dtype(tokenizer.vocab_size)
    tokens = np.concatenate([c for c, _ in chunks]) if chunks else np.empty(0, dtype=dtype)
    if all(s is None for _, s in chunks):
        return tokens, None
    parts, n = [], 0
    for arr, s in chunks:
        if s is not None:
            parts.append(s + n)
        n += len(arr)
    spans = merge_spans(np.concatenate(parts))
    return tokens, None if covers_all(spans, len(tokens)) else spans


def prepare_data(
    train_path: str | os.PathLike[str],
    tokenizer: Tokenizer,
    validation_path: str | os.PathLike[str] | None = None,
    val_fraction: float = 0.1,
    cache_dir: str | os.PathLike[str] | None = None,
) -> TokenData:
    """Tokens (and loss spans) for training and validation. With `validation_path` that file is the
    validation set; otherwise the last `val_fraction` of the training tokens (None when that is 0
    tokens)."""
    tokens, spans = tokenize_file(train_path, tokenizer, cache_dir)
    if validation_path is not None:
        try:
            val, val_spans = tokenize_file(validation_path, tokenizer, cache_dir)
        except DataError as exc:
            exc.validation = True
            raise
        return TokenData(tokens, val, spans, val_spans)
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = held_out_tokens(len(tokens), val_fraction)  # the API bounds a job's data by the same rule
    if n_val == 0:
        return TokenData(tokens, None, spans)
    cut = len(tokens) - n_val
    train_spans, val_spans = split_spans(spans, cut)
    return TokenData(tokens[:cut], tokens[cut:], train_spans, val_spans, held_out=True)
