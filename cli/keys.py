"""`fromscratch keys create|list|revoke`: API keys, straight in the database the settings name
(so they work with or without a running server)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from cli.server_settings import add_data_dir_option, load_settings, migrate_database, session_factory


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = subparsers.add_parser(
        "keys",
        help="manage API keys",
        description="API keys, written straight to the database the settings name "
        "(FROMSCRATCH_DATABASE_URL, else the data dir's SQLite), so they work with or without a "
        "running server. The keys of one owner see the same files, jobs and models; a new key gets "
        "a new owner unless --owner names one.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key; prints the secret alone on the last line")
    create.add_argument("--name", required=True, help="a label for the key")
    create.add_argument(
        "--owner",
        default=None,
        help="owner id (keys of one owner see the same files, jobs and models; default: a new owner)",
    )
    create.set_defaults(func=run_keys_create)
    lst = keys_sub.add_parser("list", help="list keys (never their secrets)")
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lst.set_defaults(func=run_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=run_keys_revoke)
    for action in (create, lst, revoke):
        add_data_dir_option(action)

    def show_help(args: argparse.Namespace) -> int:  # `fromscratch keys` without an action
        keys.print_help()
        return 2

    keys.set_defaults(func=show_help)


def run_keys_create(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    if settings.is_sqlite:
        migrate_database(settings)  # the embedded database may not exist yet; idempotent
    from core.keys import create_key

    with session_factory(settings)() as session:
        key, secret = create_key(session, args.name, owner_id=args.owner)
        session.commit()
        from cli.migrate import redact_url

        print(
            f"created key {key.id} named {key.name!r} for owner {key.owner_id} in "
            f"{redact_url(settings.database_url)}; the secret is shown only once:",
            file=sys.stderr,
        )
    print(secret)
    return 0


def run_keys_list(args: argparse.Namespace) -> int:
    """A table (full values tab-separated when not on a terminal: client.commands.output), or --json."""
    settings = load_settings(args)
    from sqlalchemy import select

    from client.commands.output import print_json, print_rows
    from core.models import ApiKey

    with session_factory(settings)() as session:
        keys = session.execute(select(ApiKey).order_by(ApiKey.created_at)).scalars().all()
    if args.json:
        data = [
            {
                "id": k.id,
                "name": k.name,
                "owner_id": k.owner_id,
                "created_at": _unix(k.created_at),
                "revoked_at": _unix(k.revoked_at) if k.revoked_at else None,
            }
            for k in keys
        ]
        print_json({"object": "list", "data": data})
        return 0
    rows = [
        [
            k.id,
            k.name,
            k.owner_id,
            f"{k.created_at:%Y-%m-%d %H:%M}",
            f"{k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "",
        ]
        for k in keys
    ]
    print_rows(["ID", "Name", "Owner", "Created", "Revoked"], rows)
    return 0


def _unix(dt: datetime) -> int:
    """Unix seconds; naive datetimes (SQLite) are UTC."""
    return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp())


def run_keys_revoke(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    from core.keys import cancel_unreachable_jobs, revoke_key
    from core.models import ApiKey

    with session_factory(settings)() as session:
        if not revoke_key(session, args.key_id):
            print(f"no key {args.key_id}; `fromscratch keys list` shows the ids", file=sys.stderr)
            return 1
        key = session.get(ApiKey, args.key_id)
        assert key is not None
        cancelled = cancel_unreachable_jobs(session, key.owner_id, key.id)
        session.commit()
    print(f"revoked {args.key_id}")
    if cancelled:
        print(
            f"cancelled {len(cancelled)} unfinished job(s) of its owner, who has no other live key: {', '.join(cancelled)}"
        )
    return 0
