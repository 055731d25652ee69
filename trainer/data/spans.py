"""Loss spans: which tokens of a token array the loss covers, as sorted, disjoint, non-adjacent
half-open ranges `[start, end)` in an int64 array of shape (R, 2). Token t is covered when it is a
target the model is trained to predict (from the tokens before it). `None` stands for "every token"
(plain text, or `train_on_inputs`).

Spans are per stretch of text (a completion, an assistant turn), so R is about the number of records,
never the number of tokens; everything here is vectorised numpy over spans or over a batch's
positions, never a Python loop per token.
"""

from __future__ import annotations

import numpy as np

SPAN_DTYPE = np.dtype("<i8")


def empty_spans() -> np.ndarray:
    return np.empty((0, 2), dtype=np.int64)


def as_spans(spans: np.ndarray | None) -> np.ndarray | None:
    """spans as a contiguous int64 (R, 2) array (None stays None)."""
    return None if spans is None else np.ascontiguousarray(np.asarray(spans, dtype=np.int64).reshape(-1, 2))


def merge_spans(spans: np.ndarray) -> np.ndarray:
    """Sorted, disjoint spans with empty ones dropped and touching ones joined."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    spans = spans[spans[:, 1] > spans[:, 0]]
    if len(spans) < 2:
        return np.ascontiguousarray(spans)
    first = np.concatenate([[True], spans[1:, 0] > spans[:-1, 1]])  # a gap before: a new span begins
    starts = spans[first, 0]
    last = np.concatenate([first[1:], [True]])
    return np.stack([starts, spans[last, 1]], axis=1)


def covers_all(spans: np.ndarray, n: int) -> bool:
    """True when the (merged) spans cover every token of an array of n tokens."""
    return n == 0 or (len(spans) == 1 and spans[0, 0] <= 0 and spans[0, 1] >= n)


def split_spans(spans: np.ndarray | None, cut: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The spans of tokens[:cut] and of tokens[cut:] (positions shifted to start at 0), from merged
    spans. Found by binary search, so a memmap is not read whole: the left part is a view of `spans`
    unless a span crosses the cut (then it is a copy with that span cut short); the right part is a
    copy."""
    if spans is None:
        return None, None
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    n_left = int(np.searchsorted(spans[:, 0], cut, side="left"))  # the spans that start before the cut
    left = spans[:n_left]
    if n_left and left[-1, 1] > cut:  # the last one crosses it
        left = np.concatenate([left[:-1], np.array([[left[-1, 0], cut]], dtype=np.int64)])
    right = spans[int(np.searchsorted(spans[:, 1], cut, side="right")) :] - cut
    if len(right):
        right[0, 0] = max(int(right[0, 0]), 0)
    return left, right


def windows_with_targets(spans: np.ndarray, starts: np.ndarray, ctx: int) -> np.ndarray:
    """For each window start s (targets at s+1..s+ctx), whether one of its targets is covered."""
    starts = np.asarray(starts, dtype=np.int64)
    if len(spans) == 0:
        return np.zeros(len(starts), dtype=bool)
    # the first span ending after s+1 holds the first covered position >= s+1, if any
    j = np.searchsorted(spans[:, 1], starts + 1, side="right")
    inside = j < len(spans)
    out = np.zeros(len(starts), dtype=bool)
    out[inside] = spans[j[inside], 0] <= starts[inside] + ctx
    return out


def start_intervals(spans: np.ndarray, ctx: int, max_start: int) -> np.ndarray:
    """The window starts in [0, max_start] that have a covered target, as merged inclusive ranges
    (lo, hi): a covered position p is a target of the windows starting at p-ctx .. p-1."""
    lo = np.maximum(spans[:, 0] - ctx, 0)
    hi = np.minimum(spans[:, 1] - 2, max_start)
    keep = lo <= hi
    # as half-open ranges, merged (lo and hi both grow with the span index)
    return merge_spans(np.stack([lo[keep], hi[keep] + 1], axis=1)) - np.array([0, 1], dtype=np.int64)


def target_mask(spans: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Whether each position (any shape) is covered."""
    if len(spans) == 0:
        return np.zeros(positions.shape, dtype=bool)
    j = np.searchsorted(spans[:, 0], positions, side="right") - 1
    return (j >= 0) & (positions < spans[np.maximum(j, 0), 1])
