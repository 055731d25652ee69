from sqlalchemy.orm import Session

from core.keys import create_key, revoke_key, verify_key
from core.models import ApiKey


def test_create_verify_revoke(db_session: Session) -> None:
    key, secret = create_key(db_session, "ci")
    db_session.commit()
    assert secret.startswith("fsk-") and len(secret) > 40
    assert secret not in key.key_hash  # only the hash is stored
    assert db_session.get(ApiKey, key.id).key_hash == key.key_hash

    found = verify_key(db_session, secret)
    assert found is not None and found.id == key.id and found.owner_id == key.owner_id
    assert verify_key(db_session, secret + "x") is None
    assert verify_key(db_session, "") is None
    assert verify_key(db_session, "Bearer " + secret) is None

    assert revoke_key(db_session, key.id)
    db_session.commit()
    assert verify_key(db_session, secret) is None
    assert not revoke_key(db_session, key.id)


def test_keys_of_one_owner_share_it_and_new_keys_get_new_owners(db_session: Session) -> None:
    a, _ = create_key(db_session, "a")
    b, secret_b = create_key(db_session, "b", owner_id=a.owner_id)
    c, _ = create_key(db_session, "c")
    db_session.commit()
    assert a.owner_id == b.owner_id != c.owner_id
    assert verify_key(db_session, secret_b).owner_id == a.owner_id


def test_revoking_an_owners_last_key_cancels_its_unfinished_jobs(db_session: Session) -> None:
    from sqlalchemy import select

    from core.keys import cancel_unreachable_jobs
    from core.models import Event, Job
    from tests.core.test_jobstates import make_job

    a, _ = create_key(db_session, "a")
    b, _ = create_key(db_session, "b", owner_id=a.owner_id)
    jobs = {status: make_job(db_session, status) for status in ("running", "queued", "succeeded")}
    for job in jobs.values():
        job.owner_id = a.owner_id
    jobs["running"].lease_owner = "worker-1"  # a worker holds it: it stops at its next step
    db_session.commit()

    assert revoke_key(db_session, a.id)
    assert cancel_unreachable_jobs(db_session, a.owner_id, a.id) == []  # b can still stop them
    assert revoke_key(db_session, b.id)
    cancelled = cancel_unreachable_jobs(db_session, a.owner_id, b.id)
    db_session.commit()
    assert sorted(cancelled) == sorted([jobs["running"].id, jobs["queued"].id])
    for status in ("running", "queued"):
        job = db_session.get(Job, jobs[status].id)
        assert job is not None and job.status == "cancelled"
        why = db_session.scalars(select(Event.message).where(Event.job_id == job.id)).all()
        assert f"Cancelled: API key {b.id}, its owner's last, was revoked" in why
    assert db_session.get(Job, jobs["running"].id).cancel_requested  # type: ignore[union-attr]
    assert db_session.get(Job, jobs["succeeded"].id).status == "succeeded"  # type: ignore[union-attr]
