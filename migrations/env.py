"""Alembic environment. The database URL comes from, in order: a connection or URL handed over in
code (`config.attributes`, see core.migrate), `-x url=...`, `sqlalchemy.url` in the config, and
finally FROMSCRATCH_DATABASE_URL via core.settings."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text
from sqlalchemy.pool import NullPool

from core.db import make_engine
from core.models import Base

config = context.config
if config.config_file_name and not config.attributes:  # the alembic CLI; code keeps its own logging
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata
# any constant: serialises concurrent `fromscratch migrate` runs against one Postgres database
_PG_LOCK_ID = 0x66726F6D  # "from"


def _url() -> str:
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        from core.settings import get_settings

        url = get_settings().database_url
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        context.run_migrations()


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = make_engine(_url(), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            _configure(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
