"""Server-side subcommands: `fromscratch serve`, `fromscratch migrate`, `fromscratch keys ...`.

All of them read the same settings (`FROMSCRATCH_*`; `--data-dir` sets `FROMSCRATCH_DATA_DIR`), so
`FROMSCRATCH_DATA_DIR=d fromscratch keys create --name x` works beside `fromscratch serve --data-dir d`.

`fromscratch serve` is the embedded install: SQLite database and kombu's `sqla+sqlite` broker in the
data dir (unless FROMSCRATCH_DATABASE_URL / FROMSCRATCH_BROKER_URL say otherwise), migrations run at
start, an API key created and printed on the first start, one `fromscratch worker` subprocess
supervised (restarted with backoff if it dies) and the API (uvicorn, `api.main:create_app`) in this
process. Ctrl-C / SIGTERM stops the API, then asks the worker to stop (a running job checkpoints and
goes back to the queue; it resumes on the next start) and waits for it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

WORKER_STOP_TIMEOUT = 60.0  # seconds the worker gets to checkpoint and exit before SIGKILL
RESTART_BACKOFF_MAX = 30.0
HEALTHY_RUN_SECONDS = 60.0  # a worker that ran this long resets the restart backoff


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the API, dashboard and one worker (embedded SQLite defaults)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="where the database, broker, blobs and scratch live "
        "(sets FROMSCRATCH_DATA_DIR; default ~/.fromscratch)",
    )
    p.add_argument("--no-worker", action="store_true", help="run the API only (workers run elsewhere)")
    p.add_argument("--log-level", default="info", help="uvicorn and worker log level (default info)")
    p.set_defaults(func=run_serve)

    p = subparsers.add_parser("migrate", help="apply database migrations (alembic upgrade head)")
    p.add_argument("--data-dir", default=None, help="sets FROMSCRATCH_DATA_DIR")
    p.set_defaults(func=run_migrate)

    keys = subparsers.add_parser("keys", help="manage API keys")
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
    lst.set_defaults(func=run_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=run_keys_revoke)
    for action in (create, lst, revoke):
        action.add_argument("--data-dir", default=None, help="sets FROMSCRATCH_DATA_DIR")
    keys.set_defaults(func=lambda args: keys.print_help() or 2)


# ------------------------------------------------------------------------------------- helpers
def _settings(args: argparse.Namespace) -> Any:
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


def _session_factory(settings: Any) -> Any:
    from core.db import make_engine, make_session_factory

    return make_session_factory(make_engine(settings.database_url))


def _migrate(settings: Any) -> None:
    from core.migrate import run_migrations

    run_migrations(settings.database_url)


# ------------------------------------------------------------------------------------- migrate / keys
def run_migrate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _migrate(settings)
    print(f"database is at the latest schema: {_redact(settings.database_url)}")
    return 0


def run_keys_create(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings.is_sqlite:
        _migrate(settings)  # the embedded database may not exist yet; idempotent
    from core.keys import create_key

    with _session_factory(settings)() as session:
        key, secret = create_key(session, args.name, owner_id=args.owner)
        session.commit()
        print(
            f"created key {key.id} named {key.name!r} for owner {key.owner_id}; the secret is shown only once:",
            file=sys.stderr,
        )
    print(secret)
    return 0


def run_keys_list(args: argparse.Namespace) -> int:
    settings = _settings(args)
    from sqlalchemy import select

    from core.models import ApiKey

    with _session_factory(settings)() as session:
        keys = session.execute(select(ApiKey).order_by(ApiKey.created_at)).scalars().all()
        print(f"{'id':<30} {'name':<20} {'owner':<30} {'created':<20} revoked")
        for k in keys:
            revoked = k.revoked_at.strftime("%Y-%m-%d %H:%M") if k.revoked_at else ""
            print(
                f"{k.id:<30} {k.name[:20]:<20} {k.owner_id[:30]:<30} {k.created_at:%Y-%m-%d %H:%M}     {revoked}"
            )
    return 0


def run_keys_revoke(args: argparse.Namespace) -> int:
    settings = _settings(args)
    from core.keys import revoke_key

    with _session_factory(settings)() as session:
        if not revoke_key(session, args.key_id):
            print(f"no key {args.key_id}; `fromscratch keys list` shows the ids", file=sys.stderr)
            return 1
        session.commit()
    print(f"revoked {args.key_id}")
    return 0


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


# ------------------------------------------------------------------------------------- serve
class WorkerSupervisor(threading.Thread):
    """Keeps one worker subprocess running: restarts it (1 s, 2 s, ... up to 30 s apart) when it
    dies, and stops it with SIGTERM (then SIGKILL after a timeout) on `stop()`."""

    def __init__(self, cmd: list[str], env: dict[str, str]):
        super().__init__(name="worker-supervisor", daemon=True)
        self.cmd, self.env = cmd, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.restarts = 0
        self._lock = threading.Lock()

    def _spawn(self) -> None:
        with self._lock:
            if self.stopping.is_set():
                return
            # its own session: a terminal's Ctrl-C reaches only `serve`, which then stops the worker
            self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True)

    def run(self) -> None:
        backoff = 1.0
        while not self.stopping.is_set():
            started = time.monotonic()
            self._spawn()
            proc = self.proc
            if proc is None:
                return
            while proc.poll() is None and not self.stopping.is_set():
                self.stopping.wait(0.5)
            if self.stopping.is_set():
                return
            if time.monotonic() - started >= HEALTHY_RUN_SECONDS:
                backoff = 1.0
            print(
                f"fromscratch serve: the worker exited with code {proc.returncode}; restarting it in "
                f"{backoff:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            self.restarts += 1
            if self.stopping.wait(backoff):
                return
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX)

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> None:
        with self._lock:
            self.stopping.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print("fromscratch serve: the worker did not stop in time; killing it", file=sys.stderr)
                proc.kill()
                proc.wait()
        self.join(timeout=5)


def _ensure_first_key(settings: Any) -> str | None:
    """Create a key when the database has none (the first start); returns its secret."""
    from sqlalchemy import func, select

    from core.keys import create_key
    from core.models import ApiKey

    with _session_factory(settings)() as session:
        if session.scalar(select(func.count()).select_from(ApiKey)):
            return None
        _, secret = create_key(session, "default")
        session.commit()
        return secret


def run_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _migrate(settings)
    secret = _ensure_first_key(settings)

    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    if ":" in shown_host:
        shown_host = f"[{shown_host}]"
    base = f"http://{shown_host}:{args.port}"
    lines = [
        "fromscratch serve",
        f"  dashboard:  {base}/",
        f"  API:        {base}/v1   (OpenAI-compatible; docs at {base}/docs)",
        f"  data dir:   {settings.data_dir}",
    ]
    if secret:
        lines += ["  API key (created on first start; shown only this once, keep it):", f"    {secret}"]
    else:
        lines += ["  API keys: existing keys work; `fromscratch keys create --name NAME` makes another"]
    print("\n".join(lines), flush=True)

    supervisor = None
    if not args.no_worker:
        cmd = [
            sys.executable,
            "-m",
            "cli.main",
            "worker",
            "--queues",
            "cpu,gpu",
            "--loglevel",
            args.log_level,
        ]
        supervisor = WorkerSupervisor(cmd, dict(os.environ))
        supervisor.start()

    import uvicorn

    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        # uvicorn installs its own handlers while serving and re-raises a captured signal after it
        # returns; this handler then just notes it, so the worker is stopped cleanly below.
        stop_requested.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        config = uvicorn.Config(
            "api.main:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            # open SSE streams must not hold the shutdown up for ever
            timeout_graceful_shutdown=5,
        )
        uvicorn.Server(config).run()
    finally:
        if supervisor is not None:
            print(
                "fromscratch serve: stopping the worker (a running job checkpoints and is re-queued)",
                file=sys.stderr,
                flush=True,
            )
            supervisor.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("fromscratch serve: stopped", file=sys.stderr, flush=True)
    return 0
