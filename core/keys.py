"""API keys: the secret is shown once (`fsk-...`); only its sha256 is stored.

A plain sha256 (not a slow password hash) is right here: the secret is 256 random bits, so there
is nothing to brute-force, and lookup by hash stays one indexed query per request.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from core import jobstates
from core.models import ApiKey, Job, new_id, utcnow
from core.status import TERMINAL

SECRET_PREFIX = "fsk-"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def create_key(session: Session, name: str, owner_id: str | None = None) -> tuple[ApiKey, str]:
    """A new key for `owner_id` (a new owner when None). Returns (row, secret); the caller commits."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name, owner_id=owner_id or new_id("owner"), key_hash=hash_secret(secret))
    session.add(key)
    session.flush()
    return key, secret


def verify_key(session: Session, secret: str) -> ApiKey | None:
    """The live key with this secret, or None (unknown, malformed or revoked)."""
    if not secret or not secret.startswith(SECRET_PREFIX):
        return None
    return session.scalar(
        select(ApiKey).where(ApiKey.key_hash == hash_secret(secret), ApiKey.revoked_at.is_(None))
    )


def revoke_key(session: Session, key_id: str) -> bool:
    """Revoke by key id; False if there is no such live key. The caller commits."""
    key = session.get(ApiKey, key_id)
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = utcnow()
    session.flush()
    return True


def cancel_unreachable_jobs(session: Session, owner_id: str, revoked_key_id: str) -> list[str]:
    """After a revocation: when the owner has no live key left, nobody can stop its jobs through
    the API any more, so its unfinished jobs are cancelled (a running one stops at its next step),
    each with an event saying why. Returns their ids; none while another live key remains. The
    caller commits."""
    live = session.scalar(select(ApiKey.id).where(ApiKey.owner_id == owner_id, ApiKey.revoked_at.is_(None)))
    if live is not None:
        return []
    unfinished = session.scalars(
        select(Job).where(Job.owner_id == owner_id, Job.status.not_in([s.value for s in TERMINAL]))
    ).all()
    for job in unfinished:
        jobstates.request_cancel(session, job)
        jobstates.add_event(
            session,
            job.id,
            f"Cancelled: API key {revoked_key_id}, its owner's last, was revoked",
            level="warn",
            data={"revoked_key": revoked_key_id},
        )
    return [job.id for job in unfinished]
