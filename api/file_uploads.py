"""What an upload checks around storing its file (issue 25 finding 9):

- `Idempotency-Key` (as on job creation): a retried upload whose first attempt was stored gets the
  first file back, nothing stored twice; the same key with other bytes is a 400
  `idempotency_key_reused`; two at once under one key store one (the unique constraint on
  (owner_id, idempotency_key) decides, the loser's blob is removed).
- A client that went away after sending its body keeps nothing: checked before the bytes are
  stored and again before the row is committed (`ClientGone`, answered to nobody)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import APIError
from core.models import File

log = logging.getLogger("fromscratch.api")
IDEMPOTENCY_KEY_CHARS = 200
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it


class ClientGone(APIError):
    def __init__(self) -> None:
        super().__init__(CLIENT_CLOSED, "The client closed the connection; the upload was not kept.")


def earlier_file(session: Session, owner_id: str, idempotency_key: str | None, sha256: str) -> File | None:
    """The live file an earlier upload with this key stored (None without a key or such a file);
    other bytes under the same key are a 400 (it is not a retry)."""
    if not idempotency_key:
        return None
    found = session.scalar(
        select(File).where(
            File.owner_id == owner_id, File.idempotency_key == idempotency_key, File.deleted_at.is_(None)
        )
    )
    if found is not None and found.sha256 != sha256:
        raise APIError(
            400,
            f"This Idempotency-Key was already used for other bytes (file {found.id}); send a new key "
            "with a new upload.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return found


def check_client(gone: Callable[[], bool], owner_id: str) -> None:
    if gone():
        log.warning("upload of owner %s not kept: its client closed the connection", owner_id)
        raise ClientGone
