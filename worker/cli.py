"""`fromscratch worker [--queues cpu,gpu|inference] [--loglevel info]`: one Celery worker process.

Training queues (cpu, gpu): pool `solo`, concurrency 1, prefetch 1: a worker runs one training job
at a time in its main process, on all its devices. `FROMSCRATCH_WORKER_DEVICES` (0 = every CUDA
device a gpu worker sees, 1 on cpu) decides the queues it consumes: `gpu` and `gpu.2` ... up to its
count (worker/devices.py), so it only ever takes a job it has the devices for. In production: one
worker per node with all its GPUs (docker-compose.yml). The `inference` queue (completions and
on-demand exports) needs a worker of its own: a thread pool of `FROMSCRATCH_INFERENCE_CONCURRENCY`
threads sharing the models it keeps loaded. Settings come from `FROMSCRATCH_*` like every other
subcommand; `--queues` overrides `FROMSCRATCH_WORKER_QUEUES`.

SIGTERM or Ctrl-C: the running job writes a checkpoint, goes back to `queued` and is re-sent, then
the worker exits (a second Ctrl-C exits at once; the job's lease then expires and the reaper
re-queues it). The reaper thread starts when the worker is ready (worker/reaper.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run a Celery training worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--queues",
        "-Q",
        default=None,
        help="comma-separated queues to consume: cpu, gpu; or inference alone "
        "(default: FROMSCRATCH_WORKER_QUEUES or cpu)",
    )
    p.add_argument("--loglevel", "-l", default="info", help="debug, info, warning, error (default info)")
    p.add_argument(
        "--hostname", "-n", default=None, help="Celery node name (default fromscratch-<pid>@<host>)"
    )
    p.set_defaults(func=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    if args.queues:
        os.environ["FROMSCRATCH_WORKER_QUEUES"] = args.queues
    from pydantic import ValidationError

    from core.settings import get_settings, reset_settings

    reset_settings()
    try:
        settings = get_settings()  # validates the queues before anything starts
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        print(f"fromscratch worker: invalid settings: {problems}", file=sys.stderr)
        return 2

    try:
        devices, queues = _devices_and_queues(settings)
        if (unusable := _schema_too_old(settings) or _unusable_store(settings)) is not None:
            raise ValueError(unusable)
    except ValueError as exc:
        print(f"fromscratch worker: {exc}", file=sys.stderr)
        return 2

    import logging

    # Celery leaves the root logger alone (worker_hijack_root_logger=False): ours is set up here.
    logging.basicConfig(
        level=args.loglevel.upper(),
        format="[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s",
    )
    from core.settings import INFERENCE_QUEUE
    from worker.celery_app import app

    hostname = args.hostname or f"fromscratch-{os.getpid()}@{socket.gethostname()}"
    if settings.queues == [INFERENCE_QUEUE]:
        pool = ["--pool=threads", f"--concurrency={settings.inference_concurrency}"]
    else:
        pool = ["--pool=solo", "--concurrency=1"]
    argv = [
        "worker",
        f"--queues={','.join(queues)}",
        *pool,
        "--prefetch-multiplier=1",
        f"--loglevel={args.loglevel}",
        f"--hostname={hostname}",
        "--without-gossip",  # workers never talk to each other: the database coordinates them
        "--without-mingle",
    ]
    logging.getLogger("fromscratch.worker").info(
        "worker %s: %d device(s), consuming %s", hostname, devices, ",".join(queues)
    )
    from worker.advertise import start_advertising

    keep_compiled_kernels(settings)
    advertiser = start_advertising(settings, hostname, devices, queues)  # the `workers` row
    try:
        app.worker_main(argv)
    finally:
        advertiser.stop()
    return 0


def _schema_too_old(settings: Settings) -> str | None:
    """A database this code's schema is not in yet (no `fromscratch migrate` run since an upgrade):
    every job would fail. None when it is, or when the database is unreachable now (waited out)."""
    from sqlalchemy.pool import NullPool

    from core.db import make_engine
    from core.migrate import schema_problem

    engine = make_engine(settings.database_url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return schema_problem(connection)
    except Exception:  # unreachable (an outage): the worker starts and waits for it
        return None
    finally:
        engine.dispose()


def _unusable_store(settings: Settings) -> str | None:
    """A blob store this worker cannot use (S3 credentials refused, no bucket) would fail every job
    it takes: said at start, and the worker does not start."""
    from core.blob_backends import new_blobs_bucket

    s3 = new_blobs_bucket(settings)
    return None if s3 is None else s3.unusable()


def _devices_and_queues(settings: Settings) -> tuple[int, list[str]]:
    """What the worker has decides which jobs it may take; a device it lacks raises (ValueError:
    worker.devices.DeviceError, worker.inference_device.InferenceDeviceError) before it starts."""
    from worker.devices import worker_queues
    from worker.inference_device import inference_device

    found = worker_queues(settings)
    if "inference" in settings.queues:
        inference_device(settings.inference_device)
    return found


def keep_compiled_kernels(settings: Settings) -> None:
    """torch.compile's inductor cache and Triton's (the eager CUDA step's fused kernels, one build
    per tile and shape) under the worker's data dir, unless TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR
    is set: they outlive the process, so a later job of the same shape compiles from cache in seconds
    instead of minutes (the defaults, under /tmp and ~/.triton, are lost with the container).
    Beside it, what compiling cost and gained per device kind and model shape
    (trainer.run.compile_memory), which compile auto's next decisions count on."""
    from trainer.run.compile_memory import ENV as COMPILE_MEMORY_ENV

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(settings.work_path / "inductor-cache"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(settings.work_path / "triton-cache"))
    os.environ.setdefault(COMPILE_MEMORY_ENV, str(settings.work_path / "compile-times.json"))
