"""Batches of training windows: `BatchSampler` draws (x, y) windows of ctx+1 tokens from a token
array, and `full_pass` walks every window of a split once (the final checkpoint's full validation).

y is x shifted left by one token. With loss spans (trainer.data.spans), y holds IGNORE_INDEX (-100) at
the targets the loss does not cover (a prompt, a user message), set for a whole batch at once with
numpy, and only windows with at least one covered target are used: a window that is all prompt would
contribute nothing, and so no batch is without a target. Without spans (plain text,
`train_on_inputs`) every token is a target and the windows are exactly those of before spans existed.

Sampler modes:
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

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from trainer.data.errors import DataError
from trainer.data.spans import as_spans, start_intervals, target_mask, windows_with_targets
from trainer.model.llama import IGNORE_INDEX

Batch = tuple[torch.Tensor, torch.Tensor]

# The final full validation pass reads at most this many windows (evenly spread over a bigger split),
# so a huge validation file cannot make the end of a run take longer than its training.
FULL_PASS_MAX_WINDOWS = 8192


VALIDATION_DATA = "validation data"  # the name a validation sampler is given


def _too_short(name: str, n: int, ctx: int) -> DataError:
    return DataError(
        f"{name} has {n} tokens, too few for one window of ctx + 1 = {ctx + 1} tokens "
        f"(ctx={ctx}); add data or lower ctx",
        validation=name == VALIDATION_DATA,
    )


def _nothing_to_train(name: str) -> DataError:
    return DataError(
        f"{name} has no window with a token the loss covers: no record has a non-empty completion or "
        "assistant message (of weight 1) to learn; add completions/assistant turns, or set "
        "train_on_inputs to train on every token",
        validation=name == VALIDATION_DATA,
    )


def gather(tokens: np.ndarray, starts: np.ndarray, ctx: int, spans: np.ndarray | None) -> Batch:
    """x, y: int64 (len(starts), ctx) windows starting at `starts`; y masked where spans say so."""
    windows = np.asarray(tokens[starts[:, None] + np.arange(ctx + 1, dtype=np.int64)], dtype=np.int64)
    y = windows[:, 1:].copy()  # a copy even for one window (a view would share x's memory)
    if spans is not None:
        y[~target_mask(spans, starts[:, None] + np.arange(1, ctx + 1, dtype=np.int64))] = IGNORE_INDEX
    return torch.from_numpy(np.ascontiguousarray(windows[:, :-1])), torch.from_numpy(y)


def epoch_starts(n_tokens: int, ctx: int, spans: np.ndarray | None) -> np.ndarray:
    """The non-overlapping window starts 0, ctx, 2*ctx, ... that fit (and have a covered target)."""
    starts = np.arange(0, n_tokens - ctx, ctx, dtype=np.int64)
    return starts if spans is None else starts[windows_with_targets(spans, starts, ctx)]


def full_pass(
    tokens: np.ndarray,
    ctx: int,
    batch_size: int,
    spans: np.ndarray | None = None,
    max_windows: int = FULL_PASS_MAX_WINDOWS,
) -> Iterator[Batch]:
    """Every window of the split once, in order (the epoch windows: each target predicted once), in
    batches of batch_size (the last may be smaller). More than max_windows: that many, evenly spread."""
    spans = as_spans(spans)
    starts = epoch_starts(len(tokens), ctx, spans)
    if len(starts) > max_windows:
        starts = starts[np.linspace(0, len(starts) - 1, max_windows).round().astype(np.int64)]
    for i in range(0, len(starts), batch_size):
        yield gather(tokens, starts[i : i + batch_size], ctx, spans)


class ResumeMismatch(ValueError):
    """A resumed run whose data or data settings differ from the checkpoint's: `fields` of the
    sampler's state that differ (n_tokens: the data, or its validation split)."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


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
        spans: np.ndarray | None = None,
        name: str = "training data",
    ):
        if ctx <= 0 or batch_size <= 0:
            raise ValueError(f"ctx and batch_size must be positive, got ctx={ctx}, batch_size={batch_size}")
        n = len(tokens)
        if n < ctx + 1:
            raise _too_short(name, n, ctx)
        self.tokens = tokens
        self.ctx = ctx
        self.batch_size = batch_size
        self.seed = seed
        self.samples_after_nl = samples_after_nl
        self.epochs = epochs
        self.spans = as_spans(spans)
        self.mode = "random" if epochs is None else "epochs"
        self._index_starts(newline_id)
        self.windows_per_epoch = self._count_windows_per_epoch()
        if self.n_starts == 0 or (self.mode == "epochs" and self.windows_per_epoch == 0):
            raise _nothing_to_train(name)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self.windows_drawn = 0
        self.position = 0  # epochs mode: next index into the current epoch's order
        self._epoch = 0
        self._order: np.ndarray | None = None

    def _index_starts(self, newline_id: int | Sequence[int]) -> None:
        """Where windows may start: every position, only after a newline (samples_after_nl), or only
        where a window holds a loss target (spans); sets n_starts."""
        n, ctx = len(self.tokens), self.ctx
        max_start = n - ctx - 1  # last start whose window of ctx+1 tokens fits
        self._starts: np.ndarray | None = None  # None = every position 0..max_start (or _intervals)
        self._intervals: np.ndarray | None = None  # spans, random mode: inclusive (lo, hi) start ranges
        self._interval_ends = np.empty(0, dtype=np.int64)  # cumulative sizes of _intervals
        if self.samples_after_nl:
            ids = np.asarray(newline_id, dtype=np.int64).reshape(-1)
            # A newline at p < max_start makes p+1 <= max_start a valid start; 0 is a line start too.
            after = np.flatnonzero(np.isin(np.asarray(self.tokens[:max_start]), ids)) + 1
            self._starts = np.unique(np.concatenate([[0], after])).astype(np.int64)
            if self.spans is not None:
                self._starts = self._starts[windows_with_targets(self.spans, self._starts, ctx)]
        elif self.spans is not None and self.mode == "random":
            self._intervals = start_intervals(self.spans, ctx, max_start)
            self._interval_ends = np.cumsum(self._intervals[:, 1] - self._intervals[:, 0] + 1)
        if self._starts is not None:
            self.n_starts = len(self._starts)
        elif self._intervals is not None:
            self.n_starts = int(self._interval_ends[-1]) if len(self._interval_ends) else 0
        else:
            self.n_starts = max_start + 1

    def _count_windows_per_epoch(self) -> int:
        """Epochs mode: the windows one epoch visits (its starts are kept); random mode, for
        reporting: as many windows as the data holds without overlap."""
        n, ctx = len(self.tokens), self.ctx
        if self.mode == "epochs":
            self._epoch_starts = (
                self._starts if self._starts is not None else epoch_starts(n, ctx, self.spans)
            )
            return len(self._epoch_starts)
        if self.spans is None:
            return max(1, (n - 1) // ctx)
        return max(1, len(epoch_starts(n, ctx, self.spans)))

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

    def _random_start(self, idx: np.ndarray) -> np.ndarray:
        """The idx-th valid start of each index."""
        if self._starts is not None:
            return self._starts[idx]
        if self._intervals is None:
            return idx
        i = np.searchsorted(self._interval_ends, idx, side="right")
        lo, hi = self._intervals[i, 0], self._intervals[i, 1]
        return lo + idx - (self._interval_ends[i] - (hi - lo + 1))

    def _next_starts(self) -> np.ndarray:
        if self.mode == "random":
            return self._random_start(self._rng.integers(0, self.n_starts, size=self.batch_size))
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

    def next_batch(self) -> Batch:
        """x, y: int64 (batch_size, ctx); y is x shifted left by one token, IGNORE_INDEX where the
        loss does not cover the target."""
        starts = self._next_starts()
        self.windows_drawn += self.batch_size
        return gather(self.tokens, starts, self.ctx, self.spans)

    def __iter__(self) -> Iterator[Batch]:
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
            "masked": self.spans is not None,
            "rng": self._rng.bit_generator.state,
            "epoch": self._epoch,
            "position": self.position,
            "windows_drawn": self.windows_drawn,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        mine = self.state_dict()
        saved = {**d, "masked": d.get("masked", False)}  # states saved before loss masking: unmasked
        fields = [
            k
            for k in ("mode", "n_tokens", "ctx", "seed", "samples_after_nl", "masked")
            if saved.get(k) != mine[k]
        ]
        if fields:
            wrong = "; ".join(f"{k}: saved {saved.get(k)!r}, now {mine[k]!r}" for k in fields)
            raise ResumeMismatch(
                f"sampler state does not match this data/config ({wrong}); resume with the same data, "
                "tokenizer, ctx, seed, val_fraction, samples_after_nl and train_on_inputs",
                fields,
            )
        self._rng.bit_generator.state = d["rng"]
        self._epoch = int(d["epoch"])
        self.position = int(d["position"])
        self.windows_drawn = int(d["windows_drawn"])
        self._order = None
