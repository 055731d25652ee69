"""The per-key quotas the API enforces: 429 `quota_exceeded` with `Retry-After`, the message naming
the quota (its setting, its value, what is in use). Nothing is written when a quota refuses.

- `max_active_jobs_per_key`: jobs validating, queued or running (create, and resume of a paused
  job). `check_active_jobs` takes the owner's quota lock first (core.quotas.lock_owner), so the
  count and the caller's insert are one step for concurrent requests: call it inside the
  transaction that adds the job, before any other write of it, and commit afterwards.
- `max_stored_bytes_per_key`: files + checkpoints + exports (uploads, new exports, and a new job
  when the key is already at it).
- `max_files_per_key`: uploads kept (`check_files`, locked as the jobs').
- `max_completions_per_key`: completions queued or running (`check_completions`, locked as the jobs').
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.errors import APIError
from core.quotas import active_jobs, kept_uploads, lock_owner, open_completions, stored_bytes

# Retry-After of a quota answer: jobs finish and free their slot within minutes at most; stored
# bytes are freed only by deleting something (the header is there for clients that back off).
JOBS_RETRY_AFTER_SECONDS = 30
STORAGE_RETRY_AFTER_SECONDS = 60
COMPLETIONS_RETRY_AFTER_SECONDS = 2  # a completion takes seconds


def quota_exceeded(
    setting: str, limit: int, detail: str, retry_after: int, param: str | None = None, retry: bool = False
) -> APIError:
    """`retry`: a retry after `retry_after` seconds may well succeed (a slot that frees by itself
    within seconds): the SDK then retries instead of raising (api/errors.py)."""
    return APIError(
        429,
        f"Quota exceeded: {detail} ({setting}={limit}, setting FROMSCRATCH_{setting.upper()}).",
        param=param,
        code="quota_exceeded",
        headers={"Retry-After": str(retry_after)},
        retry=retry,
    )


def check_active_jobs(session: Session, owner_id: str, limit: int) -> None:
    """429 when one more waiting-or-running job would pass `max_active_jobs_per_key` (`limit`).
    Holds the owner's quota lock until the caller's transaction ends."""
    lock_owner(session, owner_id)
    active = active_jobs(session, owner_id)
    if active >= limit:
        raise quota_exceeded(
            "max_active_jobs_per_key",
            limit,
            f"this key already has {active} jobs validating, queued or running, the most it may have. "
            "Wait until some finish (or cancel some), then try again",
            JOBS_RETRY_AFTER_SECONDS,
        )


def check_files(session: Session, owner_id: str, limit: int) -> None:
    """429 when one more upload would pass `max_files_per_key` (`limit`): the owner's uploads not
    deleted (a job's results file is not one). Holds the owner's quota lock, as the jobs' check."""
    lock_owner(session, owner_id)
    kept = kept_uploads(session, owner_id)
    if kept >= limit:
        raise quota_exceeded(
            "max_files_per_key",
            limit,
            f"this key keeps {kept} uploaded files, the most it may. Delete some (DELETE /v1/files/ID) first",
            STORAGE_RETRY_AFTER_SECONDS,
            "file",
        )


def check_completions(session: Session, owner_id: str, limit: int) -> None:
    """429 when one more queued-or-running completion would pass `max_completions_per_key`
    (`limit`), so one key cannot hold every inference slot. Holds the owner's quota lock until the
    caller's transaction ends (the count and the insert are one step)."""
    lock_owner(session, owner_id)
    running = open_completions(session, owner_id)
    if running >= limit:
        raise quota_exceeded(
            "max_completions_per_key",
            limit,
            f"this key (with its owner's other keys) already has {running} completions queued or "
            "running, the most it may have at once. Wait until one finishes, then try again",
            COMPLETIONS_RETRY_AFTER_SECONDS,
            retry=True,  # a completion ends within seconds: the SDK's own retries get through
        )


def storage_exceeded(limit: int, used: int, adding: int | None, what: str, param: str | None) -> APIError:
    """The 429 of `max_stored_bytes_per_key` (`limit`) for `adding` more bytes (None: not known
    yet) on top of `used`."""
    size = f" of {adding} bytes" if adding is not None else ""
    return quota_exceeded(
        "max_stored_bytes_per_key",
        limit,
        f"this key's files, checkpoints and exports use {used} bytes; {what}{size} would take it past "
        "its storage quota. Delete files (DELETE /v1/files/ID) or models (DELETE /v1/models/ID) first",
        STORAGE_RETRY_AFTER_SECONDS,
        param,
    )


def check_room_to_store(session: Session, owner_id: str, limit: int, what: str) -> None:
    """429 when the owner's stored bytes already reach `max_stored_bytes_per_key` (`limit`), so that
    `what` (of a size not known yet) could store nothing within it."""
    used = stored_bytes(session, owner_id)
    if used >= limit:
        raise storage_exceeded(limit, used, None, what, None)


def check_storage(
    session: Session, owner_id: str, limit: int, adding: int, what: str, param: str | None = None
) -> None:
    """429 when storing `adding` more bytes would pass `max_stored_bytes_per_key` (`limit`). Holds
    the owner's quota lock until the caller's transaction ends (call it after the bytes are written
    and before the row that makes them count is committed)."""
    lock_owner(session, owner_id)
    used = stored_bytes(session, owner_id)
    if used + adding > limit:
        raise storage_exceeded(limit, used, adding, what, param)
