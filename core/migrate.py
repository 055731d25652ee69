"""Schema migrations in code: `fromscratch migrate`, `fromscratch serve` and the tests call these
(equivalent to `alembic -c migrations/alembic.ini upgrade head`)."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from core.db import make_engine, normalize_url

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # the URL goes in attributes, not the ini: configparser would choke on '%' in passwords
    cfg.attributes["url"] = normalize_url(url)
    return cfg


def run_migrations(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision` (creating the schema on an empty database)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(url: str) -> str | None:
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


@functools.cache
def _known_revisions() -> tuple[str | None, frozenset[str]]:
    """(this code's head revision, every revision it knows)."""
    scripts = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return scripts.get_current_head(), frozenset(r.revision for r in scripts.walk_revisions())


def schema_problem(connection: Connection) -> str | None:
    """Why the database's schema is too old for this code (no schema at all, or a revision before
    this code's head: `fromscratch migrate` fixes either), else None. A revision this code does not
    know is a newer schema (migrated by a newer release during an upgrade): not a problem here."""
    head, known = _known_revisions()
    current = MigrationContext.configure(connection).get_current_revision()
    if current is None:
        return "the database has no schema: run `fromscratch migrate`"
    if current != head and current in known:
        return (
            f"the database schema is at revision {current}, this code needs {head}: run `fromscratch migrate`"
        )
    return None
