"""What an owner (an API key's owner) uses, for the per-key quotas, and the lock that makes a quota
check race-free.

The quotas themselves are settings (`max_active_jobs_per_key`, `max_running_jobs_per_key`,
`max_stored_bytes_per_key`, `max_files_per_key`, `max_completions_per_key`); the API enforces them
with 429s (api/quotas.py), the worker defers a job whose owner has too many running
(worker/running_quota.py) and prunes checkpoints when the owner stores too much
(worker/checkpoint_store.py).

Race-freedom: "count, then write" is only safe when no other transaction of the same owner can
count between our count and our commit. `lock_owner(session, owner_id)` serialises those
transactions: on PostgreSQL a transaction-scoped advisory lock keyed by the owner (held until
commit or rollback, other owners unaffected); on SQLite the database's single write lock, taken
up front (`BEGIN IMMEDIATE`), since SQLite serialises writers anyway.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import CompoundSelect, func, or_, select, text, union
from sqlalchemy.orm import Session

from core.models import UPLOAD_PURPOSE, Blob, Checkpoint, Export, File, InferenceRequest, Job
from core.status import ACTIVE, CLAIMABLE

# Jobs that count toward max_active_jobs_per_key: waiting for a worker or being worked on
# (validating_files, queued, running). Paused and finished jobs do not count.
COUNTED_AS_ACTIVE = CLAIMABLE | ACTIVE
# First key of the two-key advisory lock space (the second is the owner's hash): keeps these locks
# apart from any other advisory lock (migrations use the one-key space).
_PG_LOCK_CLASS = 0x71_07A5


def lock_owner(session: Session, owner_id: str) -> None:
    """Hold the owner's quota lock until the session's transaction ends (commit or rollback).
    Call it before the count whose result decides a write, and before any other write of the
    transaction on SQLite (where it takes the write lock)."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(CAST(:cls AS integer), hashtext(:owner))"),
            {"cls": _PG_LOCK_CLASS, "owner": owner_id},
        )
    elif bind.dialect.name == "sqlite":
        dbapi = session.connection().connection.dbapi_connection
        # pysqlite opens its transaction at the first write: in a transaction means "holds the lock"
        if not getattr(dbapi, "in_transaction", False):
            session.connection().exec_driver_sql("BEGIN IMMEDIATE")


def active_jobs(session: Session, owner_id: str) -> int:
    """The owner's jobs that are validating, queued or running."""
    q = (
        select(func.count())
        .select_from(Job)
        .where(Job.owner_id == owner_id, Job.status.in_(COUNTED_AS_ACTIVE))
    )
    return int(session.scalar(q) or 0)


def kept_uploads(session: Session, owner_id: str) -> int:
    """The owner's uploads not deleted (a job's results file is not one)."""
    q = (
        select(func.count())
        .select_from(File)
        .where(File.owner_id == owner_id, File.deleted_at.is_(None), File.purpose == UPLOAD_PURPOSE)
    )
    return int(session.scalar(q) or 0)


def open_completions(session: Session, owner_id: str) -> int:
    """The owner's completions queued or running."""
    q = (
        select(func.count())
        .select_from(InferenceRequest)
        .where(InferenceRequest.owner_id == owner_id, InferenceRequest.status.in_(("queued", "running")))
    )
    return int(session.scalar(q) or 0)


def held_jobs(session: Session, owner_id: str) -> int:
    """The owner's jobs a worker holds (claimed: being validated or trained)."""
    q = select(func.count()).select_from(Job).where(Job.owner_id == owner_id, Job.lease_owner.is_not(None))
    return int(session.scalar(q) or 0)


def held_jobs_by_owner(session: Session, owner_ids: Collection[str]) -> dict[str, int]:
    """`held_jobs` of several owners in one query; an owner with none held is absent."""
    rows = session.execute(
        select(Job.owner_id, func.count())
        .where(Job.owner_id.in_(owner_ids), Job.lease_owner.is_not(None))
        .group_by(Job.owner_id)
    ).all()
    return {owner: int(count) for owner, count in rows}


def stored_bytes(session: Session, owner_id: str) -> int:
    """Bytes the owner keeps: live files, checkpoints (of every job; a deleted model's too until its
    job has ended: api/model_deletion.py) and exports of the owner's models."""
    files = select(func.coalesce(func.sum(File.bytes), 0)).where(
        File.owner_id == owner_id, File.blob_id.is_not(None)
    )
    # a checkpoint's weights tar and, the newest only, its optimizer state
    checkpoints = (
        select(func.coalesce(func.sum(Blob.size), 0))
        .select_from(Checkpoint)
        .join(Blob, or_(Blob.id == Checkpoint.blob_id, Blob.id == Checkpoint.optimizer_blob_id))
        .where(Checkpoint.owner_id == owner_id)
    )
    # an export's model id is a checkpoint's model id or a finished job's fine_tuned_model
    owner_models: CompoundSelect[tuple[str | None]] = union(
        select(Checkpoint.model_id).where(Checkpoint.owner_id == owner_id),
        select(Job.fine_tuned_model).where(Job.owner_id == owner_id, Job.fine_tuned_model.is_not(None)),
    )
    exports = (
        select(func.coalesce(func.sum(Blob.size), 0))
        .select_from(Export)
        .join(Blob, Blob.id == Export.blob_id)
        .where(Export.model_id.in_(owner_models))
    )
    row = session.execute(
        select(files.scalar_subquery(), checkpoints.scalar_subquery(), exports.scalar_subquery())
    ).one()
    return sum(int(v or 0) for v in row)
