"""Engines and sessions for PostgreSQL (production, tests) and SQLite (embedded `fromscratch serve`).

SQLite notes: WAL lets readers (API, SSE streams) run while the worker writes; busy_timeout makes a
writer wait for the lock instead of failing at once. We keep pysqlite's default transaction
handling on purpose: it starts the transaction at the first write, so a read-then-write session
never holds a stale read snapshot that SQLite would refuse to upgrade (SQLITE_BUSY_SNAPSHOT, which
busy_timeout cannot wait out). Keep write transactions short: there is one writer at a time.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_SECONDS = 10


def normalize_url(url: str) -> str:
    """Pin the Postgres driver to psycopg 3 (`postgresql://` would pick psycopg2)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _sqlite_pragmas(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = NORMAL")  # durable enough with WAL, much faster commits
    cur.execute("PRAGMA foreign_keys = ON")
    cur.close()


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        connect_args.update(kwargs.pop("connect_args", {}))
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    if parsed.get_backend_name() == "postgresql":
        # an unreachable host fails a connection in seconds, not after TCP's minutes-long timeout
        kwargs["connect_args"] = {
            "connect_timeout": PG_CONNECT_TIMEOUT_SECONDS,
            **kwargs.get("connect_args", {}),
        }
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: objects stay readable after commit (API responses, worker state)
    return sessionmaker(bind=engine, expire_on_commit=False)
