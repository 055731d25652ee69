"""FastAPI dependencies as `Annotated` aliases (the full-stack-fastapi-template style):

    def route(session: SessionDep, key: CurrentKey, settings: SettingsDep, store: BlobStoreDep): ...

Everything lives on `app.state` (see api/main.py): `settings`, `engine`, `session_factory`,
`blobstore`, `celery`, `rate_limiter`. The key dependencies also count the request against the
key's rate limit (429 over it). Sessions are synchronous SQLAlchemy sessions; routes that use them are plain
`def` so FastAPI runs them in its threadpool.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Query, Request
from sqlalchemy.orm import Session

from api.errors import APIError
from api.rate_limit import RateLimiter
from core.blobstore import BlobStore
from core.models import ApiKey
from core.settings import Settings

BEARER_HELP = "Send 'Authorization: Bearer <key>' (create a key with `fromscratch keys create --name NAME`)."


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    session = request.app.state.session_factory()
    try:
        yield session
    finally:
        session.close()


def get_blobstore(request: Request) -> BlobStore:
    return request.app.state.blobstore


def bearer_secret(request: Request) -> str:
    """The key from `Authorization: Bearer <key>`; 401 (JSON) when absent or malformed."""
    header = request.headers.get("authorization")
    if not header:
        raise APIError(
            401,
            f"You didn't provide an API key. {BEARER_HELP}",
            code="missing_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise APIError(
            401,
            f"Malformed Authorization header. {BEARER_HELP}",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return secret


def authenticate(session: Session, secret: str) -> ApiKey:
    from core.keys import verify_key

    key = verify_key(session, secret)
    if key is None:
        shown = secret[:6] + "..." if len(secret) > 8 else "***"
        raise APIError(
            401,
            f"Incorrect API key provided: {shown}. {BEARER_HELP}",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return key


def limit_rate(request: Request, key: ApiKey) -> None:
    """Count the request against its key's `rate_limit` (429 over it; api/rate_limit.py)."""
    limiter: RateLimiter = request.app.state.rate_limiter
    limiter.check(key.id)


def get_current_key(request: Request, session: Annotated[Session, Depends(get_session)]) -> ApiKey:
    key = authenticate(session, bearer_secret(request))
    # End the read transaction: the connection goes back to the pool (long SSE streams and slow
    # exports must not hold one); `key` stays readable (expire_on_commit=False).
    session.commit()
    request.state.owner_id = key.owner_id
    limit_rate(request, key)
    return key


def get_stream_key(
    request: Request,
    session: Annotated[Session, Depends(get_session)],
    api_key: Annotated[
        str | None, Query(description="the API key, for a browser's EventSource (it cannot send headers)")
    ] = None,
) -> ApiKey:
    """Like get_current_key, but also accepts `?api_key=<key>`: a browser's EventSource cannot
    send headers. Only the SSE route uses it (a key in a URL can end up in access logs)."""
    query_key = api_key
    if query_key and not request.headers.get("authorization"):
        key = authenticate(session, query_key)
        session.commit()
        request.state.owner_id = key.owner_id
        limit_rate(request, key)
        return key
    return get_current_key(request, session)


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
SessionDep = Annotated[Session, Depends(get_session)]
BlobStoreDep = Annotated[BlobStore, Depends(get_blobstore)]
CurrentKey = Annotated[ApiKey, Depends(get_current_key)]
StreamKey = Annotated[ApiKey, Depends(get_stream_key)]
