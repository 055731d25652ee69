"""Data pipeline: documents -> token file (numpy memmap) -> train/val split -> batches.

- `tokenize_to_file` streams a text/JSONL file (see `trainer.dataformat`) through a tokenizer into a
  raw little-endian uint16 array (uint32 when vocab_size > 65535), written atomically. JSONL documents
  are each followed by EOS; plain text gets no BOS/EOS.
- `prepare_data` validates, tokenizes (cached by file sha256 + tokenizer hash when `cache_dir` is
  given) and splits off the last `val_fraction` of tokens, or uses a separate validation file.
- `BatchSampler` draws (x, y) windows of ctx+1 tokens. Modes:
    random (default)  starts drawn uniformly with a seeded numpy PCG64 generator (as nanoGPT);
    samples_after_nl  starts only at 0 or right after a newline token (llama.cpp --samples-after-nl);
    epochs            every window start visited once per epoch in a shuffled order. Without
                      samples_after_nl the starts are 0, ctx, 2*ctx, ... (windows overlap by the one
                      token that is the last target of one and the first input of the next, so each
                      token is predicted once per epoch, as nanoGPT/llama.cpp count epochs); with it,
                      all after-newline starts. Epoch e is shuffled by a generator seeded with
                      (seed, e), so any epoch's order can be rebuilt from the seed alone. Batches are
                      always full: the last batch of an epoch continues into the next epoch.
  `state_dict()` (JSON-serialisable) + `load_state_dict()` make a resumed sampler continue with
  exactly the batches an uninterrupted one would have produced.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.dataformat import (
    DEFAULT_CHUNK_CHARS,
    DataError,
    detect_format,
    iter_jsonl_documents,
    iter_text_chunks,
    validate_file,
)
from trainer.tokenizers import ByteTokenizer, Tokenizer

# Bump when the token-file layout or document rendering changes, so old caches are not reused.
CACHE_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def _encode(tokenizer: Tokenizer, text: str, dtype: np.dtype) -> np.ndarray:
    if type(tokenizer) is ByteTokenizer:  # fast path: the UTF-8 bytes are the ids
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(dtype)
    return np.asarray(tokenizer.encode(text), dtype=dtype)


def iter_token_chunks(
    path: str | os.PathLike[str], tokenizer: Tokenizer, chunk_chars: int = DEFAULT_CHUNK_CHARS
) -> Iterator[np.ndarray]:
    """Token arrays for a data file, about `chunk_chars` characters of input at a time."""
    dtype = token_dtype(tokenizer.vocab_size)
    if detect_format(path) == "text":
        for chunk in iter_text_chunks(path, chunk_chars):
            yield _encode(tokenizer, chunk, dtype)
        return
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    batch: list[str] = []
    size = 0

    def flush() -> np.ndarray:
        encode_batch = getattr(tokenizer, "encode_batch", None)
        if encode_batch is not None:
            arrays = [np.asarray(ids, dtype=dtype) for ids in encode_batch(batch)]
        else:
            arrays = [_encode(tokenizer, doc, dtype) for doc in batch]
        parts = [p for a in arrays for p in (a, eos)]
        return np.concatenate(parts)

    with open(path, encoding="utf-8", newline="\n") as f:
        for doc in iter_jsonl_documents(f):
            batch.append(doc)
            size += len(doc)
            if size >= chunk_chars:
                yield flush()
                batch, size = [], 0
    if batch:
        yield flush()


def tokenize_to_file(
    path: str | os.PathLike[str],
    tokenizer: Tokenizer,
    out_path: str | os.PathLike[str],
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
) -> int:
    """Tokenize `path` into a raw token array at `out_path` (written to a temp file, then renamed).
    Returns the number of tokens."""
    out_path = Path(out_path)
    tmp = out_path.with_name(f"{out_path.name}.tmp-{os.getpid()}")
    n = 0
    try:
        with open(tmp, "wb") as f:
            for arr in iter_token_chunks(path, tokenizer, chunk_chars):
                arr.astype(arr.dtype.newbyteorder("<"), copy=False).tofile(f)
                n += len(arr)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


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
    train: np.ndarray
    val: np.ndarray | None


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(json.dumps(tokenizer.to_json(), sort_keys=True).encode()).hexdigest()


def tokenize_file(
    path: str | os.PathLike[str], tokenizer: Tokenizer, cache_dir: str | os.PathLike[str] | None = None
) -> np.ndarray:
    """Validate and tokenize one file: a memmap from the cache when `cache_dir` is given, else in memory."""
    if cache_dir is not None:
        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        key = f"{file_sha256(path)[:32]}-{tokenizer_hash(tokenizer)[:16]}-v{CACHE_VERSION}"
        out = cache_dir / f"{key}.tokens"
        if not out.exists():
            validate_file(path)
            tokenize_to_file(path, tokenizer, out)
        return load_tokens(out, tokenizer.vocab_size)
    validate_file(path)
    chunks = list(iter_token_chunks(path, tokenizer))
    dtype = token_dtype(tokenizer.vocab_size)
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=dtype)


def prepare_data(
    train_path: str | os.PathLike[str],
    tokenizer: Tokenizer,
    validation_path: str | os.PathLike[str] | None = None,
    val_fraction: float = 0.1,
    cache_dir: str | os.PathLike[str] | None = None,
) -> TokenData:
    """Tokens for training and validation. With `validation_path` that file is the validation set;
    otherwise the last `val_fraction` of the training tokens (None when that is 0 tokens)."""
    tokens = tokenize_file(train_path, tokenizer, cache_dir)
    if validation_path is not None:
        return TokenData(tokens, tokenize_file(validation_path, tokenizer, cache_dir))
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = int(len(tokens) * val_fraction)
    if n_val == 0:
        return TokenData(tokens, None)
    return TokenData(tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :])


def estimate_unigram_entropy(tokens: np.ndarray | Sequence[int]) -> float:
    """Entropy (nats/token) of the tokens' empirical unigram distribution: the loss of the best
    model that ignores context, a bar a trained model should beat."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        return 0.0
    counts = np.bincount(arr.astype(np.int64))
    p = counts[counts > 0] / arr.size
    return float(-(p * np.log(p)).sum())


class BatchSampler:
    """(x, y) batches of windows from a token array; see the module docstring for the modes."""

    STATE_VERSION = 1

    def __init__(
        self,
        tokens: np.ndarray,
        ctx: int,
        batch_size: int,
        seed: int,
        samples_after_nl: bool = False,
        newline_id: int | Sequence[int] = 10,
        epochs: int | None = None,
        *,
        name: str = "training data",
    ):
        if ctx <= 0 or batch_size <= 0:
            raise ValueError(f"ctx and batch_size must be positive, got ctx={ctx}, batch_size={batch_size}")
        n = len(tokens)
        if n < ctx + 1:
            raise DataError(
                f"{name} has {n} tokens, too few for one window of ctx + 1 = {ctx + 1} tokens "
                f"(ctx={ctx}); add data or lower ctx"
            )
        self.tokens = tokens
        self.ctx = ctx
        self.batch_size = batch_size
        self.seed = seed
        self.samples_after_nl = samples_after_nl
        self.epochs = epochs
        self.mode = "random" if epochs is None else "epochs"
        max_start = n - ctx - 1  # last start whose window of ctx+1 tokens fits
        self._starts: np.ndarray | None = None  # None = every position 0..max_start
        if samples_after_nl:
            ids = np.asarray(newline_id, dtype=np.int64).reshape(-1)
            # A newline at p < max_start makes p+1 <= max_start a valid start; 0 is a line start too.
            after = np.flatnonzero(np.isin(np.asarray(tokens[:max_start]), ids)) + 1
            self._starts = np.unique(np.concatenate([[0], after])).astype(np.int64)
        self.n_starts = max_start + 1 if self._starts is None else len(self._starts)
        if self.mode == "epochs":
            self._epoch_starts = (
                self._starts if self._starts is not None else np.arange(0, max_start + 1, ctx, dtype=np.int64)
            )
            self.windows_per_epoch = len(self._epoch_starts)
        else:
            # For reporting: an "epoch" is as many windows as the data holds without overlap.
            self.windows_per_epoch = max(1, (n - 1) // ctx)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._offsets = np.arange(ctx + 1, dtype=np.int64)
        self.windows_drawn = 0
        self.position = 0  # epochs mode: next index into the current epoch's order
        self._epoch = 0
        self._order: np.ndarray | None = None

    @property
    def epoch(self) -> int:
        """Epoch the next window comes from (random mode: windows drawn // windows_per_epoch)."""
        if self.mode == "epochs":
            return self._epoch
        return self.windows_drawn // self.windows_per_epoch

    def steps_for_epochs(self, n_epochs: int) -> int:
        """Batches needed to visit every window `n_epochs` times."""
        return math.ceil(n_epochs * self.windows_per_epoch / self.batch_size)

    @property
    def total_steps(self) -> int | None:
        return None if self.epochs is None else self.steps_for_epochs(self.epochs)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        # Seeded by (seed, epoch) through SeedSequence, so runs with seeds s and s+1 do not share orders.
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        return rng.permutation(self.windows_per_epoch)

    def _next_starts(self) -> np.ndarray:
        if self.mode == "random":
            idx = self._rng.integers(0, self.n_starts, size=self.batch_size)
            return idx if self._starts is None else self._starts[idx]
        out: list[np.ndarray] = []
        need = self.batch_size
        while need:
            if self._order is None:
                self._order = self._epoch_order(self._epoch)
            take = self._order[self.position : self.position + need]
            out.append(self._epoch_starts[take])
            self.position += len(take)
            need -= len(take)
            if self.position == self.windows_per_epoch:
                self._epoch += 1
                self.position = 0
                self._order = None
        return np.concatenate(out)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: int64 (batch_size, ctx); y is x shifted left by one token."""
        starts = self._next_starts()
        windows = np.asarray(self.tokens[starts[:, None] + self._offsets], dtype=np.int64)
        self.windows_drawn += self.batch_size
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))
        return x, y

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.STATE_VERSION,
            "mode": self.mode,
            "n_tokens": len(self.tokens),
            "ctx": self.ctx,
            "seed": self.seed,
            "samples_after_nl": self.samples_after_nl,
            "rng": self._rng.bit_generator.state,
            "epoch": self._epoch,
            "position": self.position,
            "windows_drawn": self.windows_drawn,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        mine = self.state_dict()
        wrong = [
            f"{k}: saved {d.get(k)!r}, now {mine[k]!r}"
            for k in ("mode", "n_tokens", "ctx", "seed", "samples_after_nl")
            if d.get(k) != mine[k]
        ]
        if wrong:
            raise ValueError(
                "sampler state does not match this data/config ("
                + "; ".join(wrong)
                + "); resume with the same data, tokenizer and ctx"
            )
        self._rng.bit_generator.state = d["rng"]
        self._epoch = int(d["epoch"])
        self.position = int(d["position"])
        self.windows_drawn = int(d["windows_drawn"])
        self._order = None
