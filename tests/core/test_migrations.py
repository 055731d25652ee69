"""Alembic is the only schema path: upgrade -> downgrade -> upgrade works, and the migrated
schema is exactly what the models describe (no drift)."""

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.pool import NullPool

from core.db import make_engine
from core.migrate import current_revision, downgrade, head_revision, run_migrations
from core.models import Base
from tests.fixtures.service import REPO_ROOT, fromscratch_cmd


def _diffs(url: str) -> list:
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": False}
            )
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = make_engine(url, poolclass=NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _round_trip(url: str) -> None:
    model_tables = set(Base.metadata.tables)
    run_migrations(url)
    assert current_revision(url) == head_revision()
    assert _tables(url) == model_tables | {"alembic_version"}
    assert _diffs(url) == []

    downgrade(url, "base")
    assert current_revision(url) is None
    assert _tables(url) <= {"alembic_version"}

    run_migrations(url)
    run_migrations(url)  # idempotent: already at head
    assert _tables(url) == model_tables | {"alembic_version"}
    assert _diffs(url) == []


def test_postgres_upgrade_downgrade_upgrade_without_drift(pg_database_factory: Callable[..., str]) -> None:
    _round_trip(pg_database_factory(migrate=False))


def test_sqlite_upgrade_downgrade_upgrade_without_drift(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'm.db'}")


def test_drift_is_detected(tmp_path: Path) -> None:
    """The check above can fail: a schema missing a column and an index shows up as diffs."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    run_migrations(url)
    engine = make_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_jobs_owner_id")
        conn.exec_driver_sql("ALTER TABLE metrics DROP COLUMN grad_norm")
    engine.dispose()
    kinds = {d[0] if isinstance(d, tuple) else d[0][0] for d in _diffs(url)}
    assert {"add_index", "add_column"} <= kinds


@pytest.mark.parametrize("url_form", ["postgresql://", "postgresql+psycopg://"])
def test_plain_postgres_urls_use_psycopg3(pg_database_factory: Callable[..., str], url_form: str) -> None:
    url = pg_database_factory(migrate=False).replace("postgresql+psycopg://", url_form)
    run_migrations(url)
    assert current_revision(url) == head_revision()


def test_a_worker_does_not_start_on_a_database_not_migrated(tmp_path: Path) -> None:
    """It would take jobs and fail each (and log a failed advertisement every few seconds): it says
    what to run and exits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env["FROMSCRATCH_DATA_DIR"] = str(tmp_path)  # an embedded SQLite database nobody migrated
    cmd = fromscratch_cmd("worker", "--queues", "cpu")
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "fromscratch worker: the database has no schema: run `fromscratch migrate`" in done.stderr
