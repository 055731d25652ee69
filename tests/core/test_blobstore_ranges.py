"""Byte ranges read from each blob backend (issue 25 finding 9: a download resumes with `Range`):
the bytes of any range, read from where it starts (the db backend skips whole chunks by their
lengths, fs seeks, s3 asks for the range), and never more than the range."""

from __future__ import annotations

import pytest

from core.blobstore import BlobStore
from tests.core.test_blobstore import CHUNK, DATA, store  # noqa: F401 (the fixture: db, fs, s3)


@pytest.mark.parametrize(
    "start,end",
    [(0, 0), (5, 17), (CHUNK - 1, CHUNK), (3 * CHUNK + 7, None), (len(DATA) - 1, None), (0, len(DATA) + 50)],
)
def test_a_range_reads_those_bytes(store: BlobStore, start: int, end: int | None) -> None:  # noqa: F811
    with store.session_factory() as s:
        blob = store.put(iter([DATA]), s)
        s.commit()
    got = b"".join(store.open(blob.id, start, end))
    assert got == DATA[start : None if end is None else end + 1]


def test_a_range_reads_from_its_start_not_the_blobs(store: BlobStore) -> None:  # noqa: F811
    """Reading the last bytes of a blob fetches at most the chunk that holds them."""
    with store.session_factory() as s:
        blob = store.put(iter([DATA]), s)
        s.commit()
    chunks = list(store.open(blob.id, len(DATA) - 10))
    assert b"".join(chunks) == DATA[-10:]
    assert sum(len(c) for c in chunks) == 10 and len(chunks) == 1
