"""Walking an exception's chain of causes, once each: a chain may loop (an error raised `from`
itself, or a context that leads back), and a loop must not hang whoever asks what failed."""

from __future__ import annotations

from collections.abc import Iterator


def error_chain(error: BaseException, *, contexts: bool = True) -> Iterator[BaseException]:
    """`error`, then what it was raised from (`__cause__`), or else, with `contexts`, what was being
    handled when it was raised (`__context__`); each error at most once."""
    seen: BaseException | None = error
    walked: set[int] = set()
    while seen is not None and id(seen) not in walked:
        yield seen
        walked.add(id(seen))
        seen = seen.__cause__ or (seen.__context__ if contexts else None)
