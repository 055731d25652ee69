"""What the server-side commands (`serve`, `migrate`, `keys`) share: the settings, read after
`--data-dir` is applied, and the database those settings name.

All of them read the same settings (`FROMSCRATCH_*`; `--data-dir` sets `FROMSCRATCH_DATA_DIR`), so
`FROMSCRATCH_DATA_DIR=d fromscratch keys create --name x` works beside `fromscratch serve --data-dir d`.
The service stack is imported inside the functions: `fromscratch train` must not pay for it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from core.settings import Settings


def add_data_dir_option(
    parser: argparse.ArgumentParser, help_text: str = "sets FROMSCRATCH_DATA_DIR"
) -> None:
    parser.add_argument("--data-dir", default=None, help=help_text)


def load_settings(args: argparse.Namespace) -> Settings:
    """Apply --data-dir to the environment (so child processes see it too) and read settings."""
    if getattr(args, "data_dir", None):
        os.environ["FROMSCRATCH_DATA_DIR"] = str(Path(args.data_dir).expanduser().resolve())
    from pydantic import ValidationError

    from core.settings import get_settings, reset_settings

    reset_settings()
    try:
        settings = get_settings()
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise SystemExit(f"fromscratch: invalid settings (FROMSCRATCH_* variables): {problems}") from None
    if settings.is_sqlite:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings


def session_factory(settings: Settings) -> sessionmaker[Session]:
    from core.db import make_engine, make_session_factory

    return make_session_factory(make_engine(settings.database_url))


def migrate_database(settings: Settings) -> None:
    from core.migrate import run_migrations

    run_migrations(settings.database_url)


def prepare_blob_store(settings: Settings) -> str | None:
    """With the s3 blob backend, create its bucket unless it exists; a line saying so, else None."""
    from core.blob_backends import new_blobs_bucket

    s3 = new_blobs_bucket(settings)
    if s3 is None:
        return None
    made = s3.ensure_bucket()
    return f"S3 bucket {settings.s3_bucket!r} {'created' if made else 'exists'}"
