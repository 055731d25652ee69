"""`fromscratch migrate`: bring the database to the latest schema (alembic upgrade head) and, with
the s3 blob backend, create the bucket unless it exists."""

from __future__ import annotations

import argparse
import sys

from cli.server_settings import add_data_dir_option, load_settings, migrate_database, prepare_blob_store


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "migrate",
        help="apply database migrations (alembic upgrade head); create the S3 bucket if needed",
        description="Bring the database the settings name (FROMSCRATCH_DATABASE_URL, else the data "
        "dir's SQLite) to the latest schema, and with the s3 blob backend create the bucket unless it "
        "exists. `fromscratch serve` does this itself at start; run it before starting API servers "
        "and workers on their own (docker compose runs it first).",
    )
    add_data_dir_option(p)
    p.set_defaults(func=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    migrate_database(settings)
    print(f"database is at the latest schema: {redact_url(settings.database_url)}")
    from core.blob_errors import BlobError

    try:
        blobs = prepare_blob_store(settings)
    except BlobError as exc:
        print(f"fromscratch migrate: {exc}", file=sys.stderr)
        return 2
    if blobs:
        print(blobs)
    return 0


def redact_url(url: str) -> str:
    """The database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url
