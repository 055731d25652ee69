"""What one tenant's streams may take from everyone else (issue 25 finding 7: 200 SSE streams from
one key pushed another tenant's `GET /v1/files` from 14 ms to 1.3 s at the median):

- at most `max_streams_per_key` open streams per key (job streams and streamed completions
  together); one more is a 429 `too_many_streams` naming the setting. Counted in this API process
  (each process of a multi-process deployment counts its own);
- their database polls run on a thread limiter of their own (`stream_poll_threads`), so however many
  streams are open, the other requests keep the rest of the thread pool (40 threads by default) and
  of the database connections."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import FastAPI

from api.errors import APIError
from core.settings import Settings

T = TypeVar("T")


class StreamLimits:
    def __init__(self, settings: Settings) -> None:
        self.per_key = settings.max_streams_per_key
        self.open: Counter[str] = Counter()
        self._poll_threads = settings.stream_poll_threads
        self._limiter: CapacityLimiter | None = None  # made in the event loop that uses it

    def reserve(self, key_id: str) -> Callable[[], None]:
        """One of the key's stream slots, taken now (429 when the key has its limit open, before
        any work or response starts); returns its release, which may be called more than once."""
        if self.open[key_id] >= self.per_key:
            raise APIError(
                429,
                f"This API key has {self.open[key_id]} streams open, the most one key may have "
                f"(FROMSCRATCH_MAX_STREAMS_PER_KEY={self.per_key}); close one or wait for one to end.",
                code="too_many_streams",
                headers={"Retry-After": "5"},
            )
        self.open[key_id] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open[key_id] -= 1
                if not self.open[key_id]:
                    del self.open[key_id]

        return release

    def guarded(self, key_id: str, frames: AsyncIterator[str]) -> AsyncIterator[str]:
        """`frames` holding one of the key's stream slots until they end (see `reserve`)."""
        return holding(self.reserve(key_id), frames)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on a worker thread, at most `stream_poll_threads` at a time for all streams."""
        if self._limiter is None:
            self._limiter = CapacityLimiter(self._poll_threads)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)


def holding(release: Callable[[], None], frames: AsyncIterator[str]) -> AsyncIterator[str]:
    """`frames`, calling `release` when they end, fail or are closed, or when the response that
    would send them is dropped unsent (its generator never starts: a finalizer releases)."""

    async def relay() -> AsyncIterator[str]:
        try:
            async for frame in frames:
                yield frame
        finally:
            release()

    stream = relay()
    weakref.finalize(stream, release)
    return stream


def stream_limits(app: FastAPI) -> StreamLimits:
    limits: StreamLimits = app.state.stream_limits
    return limits
