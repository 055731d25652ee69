"""The boto3 client the `s3` backend talks through, and how its errors read.

Credentials come from boto3's usual chain: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and
`AWS_SESSION_TOKEN`) in the environment first, then the shared files or an instance role. The
region is `AWS_REGION`, else `AWS_DEFAULT_REGION`, else boto3's config, else (for an S3-compatible
server at `endpoint_url`, which ignores it but signs with it) `us-east-1`.

Retries: botocore's "standard" mode retries throttling, 5xx answers, connection errors and
timeouts with exponential backoff and jitter, up to `max_attempts` tries per request (request
bodies here are bytes, so a retried upload sends the same part again). A body that breaks off while
being read is resumed by the backend itself (s3.py), which botocore does not do.
"""

from __future__ import annotations

import os
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

DEFAULT_REGION = "us-east-1"
MAX_ATTEMPTS = 5
CONNECT_TIMEOUT_SECONDS = 10.0
READ_TIMEOUT_SECONDS = 60.0
# S3's answers for "busy or broken, try later" (botocore retried them MAX_ATTEMPTS times already)
OUTAGE_CODES = frozenset({"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown"})
# S3's codes for "that key, or the bucket, is not there"
MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchBucket"})


def region_from_env(endpoint_url: str | None) -> str | None:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        return region
    return DEFAULT_REGION if endpoint_url else None  # None: boto3's config files decide


def make_client(endpoint_url: str | None, *, max_attempts: int = MAX_ATTEMPTS) -> Any:
    """An S3 client (thread-safe) for AWS, or for the S3-compatible server at `endpoint_url`."""
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=region_from_env(endpoint_url),
        signature_version="s3v4",
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        # SeaweedFS and MinIO serve buckets as paths; AWS picks virtual hosts by itself
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=config)


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError (`NoSuchKey`, `InvalidRange`, `404`...), else ""."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def is_missing(exc: BaseException) -> bool:
    return error_code(exc) in MISSING_CODES


# S3's codes for "these credentials may not do that": a setting to fix, not an outage to wait out
REFUSED_CODES = frozenset(
    {
        "403",
        "Forbidden",
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
    }
)


def is_refused(exc: BaseException) -> bool:
    return error_code(exc) in REFUSED_CODES


CREDENTIALS_HELP = (
    "check the S3 credentials this process has (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the "
    "S3 server's configured keys) and that they may use the bucket"
)


def is_transport_error(exc: BaseException) -> bool:
    """A failure of the connection itself (refused, reset, timed out, a body cut short), as
    opposed to an answer from the server."""
    return isinstance(exc, BotoCoreError)


def is_outage(exc: BaseException) -> bool:
    """The server unreachable or failing (no connection, a timeout, 5xx or throttling after
    botocore's own retries): worth trying again later, unlike an answer about the request."""
    return is_transport_error(exc) or error_code(exc) in OUTAGE_CODES
