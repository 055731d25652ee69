"""`fromscratch serve`: the API, the dashboard and one supervised worker from one command (the
embedded install; DESCRIPTION, its --help text, tells the whole story)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

from cli.server_settings import (
    add_data_dir_option,
    load_settings,
    migrate_database,
    prepare_blob_store,
    session_factory,
)
from cli.worker_supervisor import WorkerSupervisor

if TYPE_CHECKING:
    import uvicorn

    from core.settings import Settings

DESCRIPTION = """Run the whole service on this machine: the API and dashboard, and its workers.

The embedded install: the SQLite database, kombu's `sqla+sqlite` broker and the blobs (uploads,
checkpoints, exports: files under `blobs/`) live in the data dir, unless FROMSCRATCH_DATABASE_URL,
FROMSCRATCH_BROKER_URL or FROMSCRATCH_BLOB_BACKEND say otherwise. At start it runs the migrations,
creates the broker's tables and queues, and creates and prints an API key on the first start.

It supervises `fromscratch worker` subprocesses, restarted with backoff if they die: a training
worker (queues cpu,gpu; --training-workers for more, each one job at a time) and an inference
worker (queue inference: completions and on-demand exports, models kept loaded). The API (uvicorn) runs in this process and never loads torch.

Ctrl-C or SIGTERM stops the API, then the workers: a running job checkpoints, goes back to the queue
and resumes on the next start.

`fromscratch keys` and `fromscratch migrate` read the same settings (`FROMSCRATCH_*`; `--data-dir`
sets FROMSCRATCH_DATA_DIR), so `fromscratch keys create --name x --data-dir d` works beside
`fromscratch serve --data-dir d`.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the API, dashboard and the workers (embedded SQLite defaults)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    add_data_dir_option(
        p,
        "where the database, broker, blobs and scratch live "
        "(sets FROMSCRATCH_DATA_DIR; default ~/.fromscratch)",
    )
    p.add_argument("--no-worker", action="store_true", help="run the API only (workers run elsewhere)")
    p.add_argument(
        "--training-workers",
        type=_worker_count,
        default=1,
        metavar="N",
        help="training workers, each running one job at a time (default 1); they share this "
        "machine's CPU cores, or its GPU (several GPUs: a `fromscratch worker` per GPU, "
        "FROMSCRATCH_DEVICE=cuda:N)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn and worker log level (default info)")
    p.set_defaults(func=run_serve)


MAX_TRAINING_WORKERS = 64


def _worker_count(text: str) -> int:
    n = int(text)
    if not 1 <= n <= MAX_TRAINING_WORKERS:
        raise argparse.ArgumentTypeError(f"from 1 to {MAX_TRAINING_WORKERS}, got {n}")
    return n


def _ensure_first_key(settings: Settings) -> str | None:
    """Create a key when the database has none (the first start); returns its secret."""
    from sqlalchemy import func, select

    from core.keys import create_key
    from core.models import ApiKey

    with session_factory(settings)() as session:
        if session.scalar(select(func.count()).select_from(ApiKey)):
            return None
        _, secret = create_key(session, "default")
        session.commit()
        return secret


def run_serve(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    migrate_database(settings)
    prepare_blob_store(settings)
    from core.broker import prepare_broker

    # its tables and queues, before the API and the workers race to create them (core/broker.py)
    prepare_broker(settings)
    print(_banner(args.host, args.port, settings, _ensure_first_key(settings)), flush=True)
    supervisors = [] if args.no_worker else _start_workers(args.log_level, args.training_workers)
    if supervisors:
        _wait_for_training_worker(settings)

    import uvicorn

    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        # uvicorn installs its own handlers while serving and re-raises a captured signal after it
        # returns; this handler then just notes it, so the worker is stopped cleanly below.
        stop_requested.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(uvicorn_config(args)).run()
    finally:
        _stop_workers(supervisors)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("fromscratch serve: stopped", file=sys.stderr, flush=True)
    return 0


def uvicorn_config(args: argparse.Namespace) -> uvicorn.Config:
    """The API's server: the factory, on the protocol that bounds request heads (as the Dockerfile's
    and compose's `--http`, api/http_server.py)."""
    import uvicorn

    from api.http_server import GRACEFUL_SHUTDOWN_SECONDS, BoundedHeadProtocol

    return uvicorn.Config(
        "api.main:create_app",
        factory=True,
        http=BoundedHeadProtocol,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # open SSE streams must not hold the shutdown up for ever
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )


def _banner(host: str, port: int, settings: Settings, secret: str | None) -> str:
    """What `serve` prints at start: where the dashboard and API are, and the first key."""
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown_host:
        shown_host = f"[{shown_host}]"
    base = f"http://{shown_host}:{port}"
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
    return "\n".join(lines)


def _start_workers(log_level: str, training_workers: int = 1) -> list[WorkerSupervisor]:
    """The training workers (queues cpu,gpu) and the inference worker, each supervised."""
    supervisors = []
    named = [(f"cpu,gpu #{i + 1}" if training_workers > 1 else "cpu,gpu") for i in range(training_workers)]
    for name in [*named, "inference"]:
        queues = name.split(" ")[0]
        cmd = [sys.executable, "-m", "cli.main", "worker", "--queues", queues, "--loglevel", log_level]
        supervisors.append(WorkerSupervisor(cmd, dict(os.environ), name=f"worker {name}"))
    for supervisor in supervisors:
        supervisor.start()
    return supervisors


def _wait_for_training_worker(settings: Settings, timeout: float = 120.0) -> None:
    """Serves once the training worker has advertised its devices: a job placed before would not
    see a GPU worker (api/placement.py) and go to the cpu queue. It takes seconds (the worker
    imports torch); a worker that never starts is reported and the API starts anyway."""
    import time

    from sqlalchemy import select

    from core.device_queues import split_queue
    from core.models import Worker, utcnow

    since, deadline = utcnow(), time.monotonic() + timeout
    print("fromscratch serve: waiting for the training worker to start", file=sys.stderr, flush=True)
    sessions = session_factory(settings)  # one engine for every poll
    while time.monotonic() < deadline:
        with sessions() as session:
            rows = session.scalars(select(Worker.queues).where(Worker.started_at >= since))
            if any(split_queue(q) is not None for queues in rows for q in queues):  # cpu or gpu
                return
        time.sleep(0.25)
    print(
        f"fromscratch serve: the training worker did not start within {timeout:.0f} s; serving anyway "
        "(jobs without a device go to the default queue until it does)",
        file=sys.stderr,
        flush=True,
    )


def _stop_workers(supervisors: list[WorkerSupervisor]) -> None:
    if not supervisors:
        return
    print(
        "fromscratch serve: stopping the workers (a running job checkpoints and is re-queued)",
        file=sys.stderr,
        flush=True,
    )
    for supervisor in supervisors:  # both asked first, so they shut down side by side
        supervisor.request_stop()
    for supervisor in supervisors:
        supervisor.stop()
