"""503, not 500, while the blob store's S3 server is unreachable or failing.

An upload, a download or a completion that meets an S3 outage (core.blob_errors.is_store_outage:
no connection, a timeout, 5xx or throttling after botocore's own retries) answers 503 in the error
envelope with code `storage_unavailable` and `Retry-After`, from a regular exception handler, so the
response is complete and the connection stays open; one log line per request, no traceback. S3
refusing the server's credentials is a 503 too (`storage_misconfigured`, no retry: the operator's
to fix), logged as an error saying so. Other S3 errors stay 500s: faults to look into. A download reads its
first bytes before answering (api/ranges.py), so an outage is this 503, not a 200 cut short.

Installed only with the s3 backend: without it botocore is never imported.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.errors import error_response
from api.response_headers import SHOULD_RETRY_HEADER
from core.blob_errors import is_store_outage
from core.error_chain import error_chain
from core.settings import Settings

log = logging.getLogger("fromscratch.api")

RETRY_AFTER_SECONDS = 5
UNAVAILABLE_MESSAGE = "The file store is temporarily unavailable. Retry the request in a few seconds."


def install_store_error_handler(app: FastAPI, settings: Settings) -> None:
    if settings.blob_backend != "s3":
        return
    from botocore.exceptions import BotoCoreError, ClientError

    from core.blob_backends.s3_client import CREDENTIALS_HELP, is_refused

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        if any(is_refused(seen) for seen in error_chain(exc)):
            log.error("the S3 server refuses this API server's credentials (%s): %s", exc, CREDENTIALS_HELP)
            return error_response(
                503,
                "The file store refuses this server's credentials: the service's operator must fix them.",
                code="storage_misconfigured",
                headers={SHOULD_RETRY_HEADER: "false"},
            )
        if not is_store_outage(exc):
            raise exc  # answered 500 by the outermost handler, with its traceback logged
        log.warning("blob store unreachable: %s %s answered 503 (%s)", request.method, request.url.path, exc)
        return error_response(
            503,
            UNAVAILABLE_MESSAGE,
            code="storage_unavailable",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    for error_class in (BotoCoreError, ClientError):
        app.add_exception_handler(error_class, unavailable)
