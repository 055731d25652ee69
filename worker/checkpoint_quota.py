"""Checkpoints under the owner's storage quota (`max_stored_bytes_per_key`): a running job is never
failed for storing too much. When a stored checkpoint takes the owner past the quota, the job's
oldest step checkpoints are dropped (never its newest, its final one, its best so far, or one a
download was exported from) until the owner is inside the quota again or nothing more can go, and
the job gets one `warn` event saying so (once per job)."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from core.jobstates import add_event
from core.models import Blob, Checkpoint, Event, Export
from core.quotas import stored_bytes

log = logging.getLogger(__name__)

QUOTA = "max_stored_bytes_per_key"  # the `quota` of the warning event


def prune_over_quota(
    session: Session, job_id: str, owner_id: str, limit: int, protect_step: int | None = None
) -> list[str]:
    """Delete the job's oldest step checkpoint rows while the owner stores more than `limit` bytes
    (in the caller's transaction, its pending changes included). Returns the blob ids to delete
    once the transaction committed."""
    used = stored_bytes(session, owner_id)
    if used <= limit:
        return []
    rows = session.execute(
        select(Checkpoint, func.sum(Blob.size))
        .join(Blob, or_(Blob.id == Checkpoint.blob_id, Blob.id == Checkpoint.optimizer_blob_id))
        .where(Checkpoint.job_id == job_id)
        .group_by(Checkpoint.id)
        .order_by(Checkpoint.step)
    ).all()
    newest_step = max((c.step for c, _ in rows), default=None)
    kept = (newest_step, protect_step)
    candidates = [(c, size) for c, size in rows if not c.is_final and c.step not in kept]
    exported = set(
        session.scalars(
            select(Export.model_id).where(Export.model_id.in_([c.model_id for c, _ in candidates]))
        )
    )
    doomed: list[str] = []
    for ckpt, size in candidates:
        if used <= limit:
            break
        if ckpt.model_id in exported:
            continue
        doomed += [b for b in (ckpt.blob_id, ckpt.optimizer_blob_id) if b is not None]
        session.delete(ckpt)
        used -= int(size)
    _warn_once(session, job_id, used, limit, len(doomed))
    log.info(
        "job %s: over %s (%d > %d bytes): dropped %d checkpoints", job_id, QUOTA, used, limit, len(doomed)
    )
    return doomed


def _warn_once(session: Session, job_id: str, used: int, limit: int, dropped: int) -> None:
    warnings: list[dict[str, Any] | None] = list(
        session.scalars(select(Event.data).where(Event.job_id == job_id, Event.level == "warn"))
    )
    if any(data and data.get("quota") == QUOTA for data in warnings):
        return
    still = "" if used <= limit else f" This key still stores {used} bytes, over the quota."
    add_event(
        session,
        job_id,
        f"This key's storage is over its quota ({QUOTA}={limit} bytes, setting "
        f"FROMSCRATCH_{QUOTA.upper()}): the job keeps only its newest checkpoints "
        f"({dropped} older ones dropped now).{still} Delete files or models to keep more.",
        level="warn",
        data={"quota": QUOTA, "limit": limit, "dropped": dropped},
    )
