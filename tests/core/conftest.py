"""Core tests get their own databases: a fresh Postgres database per module and a fresh SQLite
file per test, so row counts and the reaper's scans see only what the test made."""

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_engine, make_session_factory


@pytest.fixture(scope="module")
def pg_module_factory(pg_database_factory: Callable[..., str]) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_database_factory())
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(params=["postgres", "sqlite"])
def any_factory(request: pytest.FixtureRequest) -> sessionmaker[Session]:
    """The same test on Postgres (production) and SQLite (embedded serve)."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_module_factory")
    return request.getfixturevalue("sqlite_session_factory")
