"""The blob store's errors (core/blobstore.py re-exports them): every backend raises these."""

from __future__ import annotations


class BlobError(Exception):
    pass


class BlobNotFound(BlobError, LookupError):
    def __init__(self, blob_id: str) -> None:
        super().__init__(f"blob {blob_id} does not exist or is not complete")
        self.blob_id = blob_id


class BlobTooLarge(BlobError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the data is larger than the limit of {limit} bytes")
        self.limit = limit


class BlobCorrupt(BlobError):
    """The stored bytes are not what the row recorded: wrong size or sha256, or missing."""
