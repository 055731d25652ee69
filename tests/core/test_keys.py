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
