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


def is_store_outage(error: BaseException) -> bool:
    """The blob store's server (S3, or the database for "db" blobs) was unreachable or failing:
    an outage to wait out, not a fault of the data. Looks through the chain of causes."""
    from core.db_faults import is_connection_error
    from core.error_chain import error_chain

    return any(is_connection_error(seen) or _is_s3_outage(seen) for seen in error_chain(error))


def _is_s3_outage(error: BaseException) -> bool:
    if not type(error).__module__.startswith("botocore"):
        return False  # not an S3 client's error (and botocore stays unimported without s3)
    from core.blob_backends.s3_client import is_outage

    return is_outage(error)
