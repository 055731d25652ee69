"""Loss-stream latency: time from the worker writing a metric row (its commit) to an SSE client
of `GET /v1/fine_tuning/jobs/{id}/stream` receiving it, p50/p95, with 1 and with 50 concurrent
clients (goal: p95 <= 300 ms).

A real `fromscratch serve --no-worker` runs the API; this script plays the worker's part: it
commits Metric rows for a job, one at a time at jittered intervals, exactly as the worker's
metrics writer does (same models, same database), and each client timestamps the SSE event
carrying that step. Both ends are on this machine, so one clock serves both.

    .venv/bin/python bench/stream_latency.py                 # embedded SQLite
    .venv/bin/python bench/stream_latency.py --postgres      # Postgres (+ Redis broker)
    .venv/bin/python bench/stream_latency.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._service import (
    REDIS_URL,
    SHAKESPEARE,
    Service,
    fresh_postgres_db,
    machine,
    median,
    percentile,
    print_table,
    serve,
)


async def _client(
    svc: Service, job_id: str, received: dict[int, float], ready: asyncio.Event, done: asyncio.Event
) -> None:
    async with (
        httpx.AsyncClient(base_url=svc.url, headers=svc.headers, timeout=None) as client,
        client.stream("GET", f"/v1/fine_tuning/jobs/{job_id}/stream") as resp,
    ):
        resp.raise_for_status()
        event = None
        async for line in resp.aiter_lines():
            now = time.time()
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                if event == "status":
                    ready.set()
                elif event == "metrics":
                    step = int(json.loads(line[5:])["step"])
                    received.setdefault(step, now)
            if done.is_set():
                return


def _writer(
    database_url: str, job_id: str, n: int, interval: float, start_step: int, written: dict[int, float]
) -> None:
    """Commit one Metric row at a time, as the worker's writer does; note the time after commit."""
    from core.db import make_engine, make_session_factory
    from core.models import Metric

    engine = make_engine(database_url)
    factory = make_session_factory(engine)
    rng = random.Random(0)
    try:
        for i in range(n):
            step = start_step + i
            with factory() as session:
                session.add(
                    Metric(
                        job_id=job_id,
                        step=step,
                        train_loss=5.0 - i * 1e-3,
                        lr=1e-3,
                        tokens_per_s=1000.0,
                        tokens_seen=step * 2048,
                    )
                )
                session.commit()
            written[step] = time.time()
            time.sleep(interval * rng.uniform(0.5, 1.5))  # not phase-locked with the server's poll
    finally:
        engine.dispose()


async def measure(
    svc: Service, job_id: str, n_clients: int, n_metrics: int, interval: float, start_step: int
) -> list[float]:
    """Latencies (s) of every (client, metric) pair."""
    received = [dict[int, float]() for _ in range(n_clients)]
    readies = [asyncio.Event() for _ in range(n_clients)]
    done = asyncio.Event()
    tasks = [
        asyncio.create_task(_client(svc, job_id, received[i], readies[i], done)) for i in range(n_clients)
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=60)
    written: dict[int, float] = {}
    writer = threading.Thread(
        target=_writer, args=(svc.database_url, job_id, n_metrics, interval, start_step, written)
    )
    writer.start()
    while writer.is_alive():
        await asyncio.sleep(0.05)
    last = start_step + n_metrics - 1
    deadline = time.monotonic() + 10
    while any(last not in r for r in received) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    done.set()
    for t in tasks:
        t.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.gather(*tasks, return_exceptions=True)
    lat = [r[s] - written[s] for r in received for s in written if s in r]
    missing = sum(1 for r in received for s in written if s not in r)
    if missing:
        print(f"  warning: {missing} metric events never arrived", flush=True)
    return lat


def run(
    args: argparse.Namespace, database_url: str | None, broker_url: str | None, label: str
) -> list[tuple[str, ...]]:
    rows = []
    with serve(database_url=database_url, broker_url=broker_url, worker=False) as svc:
        file_id = svc.upload(SHAKESPEARE)
        job_id = svc.create_job(file_id, "llama-tiny", {"max_steps": 1000})  # no worker: it stays queued
        step = 1
        for n_clients in args.clients:
            lat = asyncio.run(measure(svc, job_id, n_clients, args.metrics, args.interval, step))
            step += args.metrics
            ms = [x * 1000 for x in lat]
            print(
                f"  {label}, {n_clients} clients: p50 {percentile(ms, 50):.0f} ms, p95 {percentile(ms, 95):.0f} ms "
                f"({len(ms)} samples)",
                flush=True,
            )
            rows.append(
                (
                    label,
                    str(n_clients),
                    str(len(ms)),
                    f"{percentile(ms, 50):.0f}",
                    f"{percentile(ms, 95):.0f}",
                    f"{max(ms) if ms else float('nan'):.0f}",
                    f"{median(ms):.0f}",
                    "yes" if ms and percentile(ms, 95) <= 300 else "NO",
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a few metrics, 1 and 3 clients")
    ap.add_argument("--postgres", action="store_true", help="Postgres + Redis instead of embedded SQLite")
    ap.add_argument("--both", action="store_true", help="embedded SQLite, then Postgres + Redis")
    ap.add_argument("--metrics", type=int, default=None, help="metrics written per measurement (default 60)")
    ap.add_argument("--interval", type=float, default=0.1, help="mean seconds between metric writes")
    ap.add_argument("--clients", default=None, help="comma-separated client counts (default 1,50)")
    args = ap.parse_args(argv)
    args.metrics = args.metrics or (8 if args.smoke else 60)
    args.clients = [int(c) for c in (args.clients or ("1,3" if args.smoke else "1,50")).split(",")]

    rows: list[tuple[str, ...]] = []
    if not args.postgres or args.both:
        rows += run(args, None, None, "embedded (SQLite)")
    if args.postgres or args.both:
        with fresh_postgres_db() as url:
            rows += run(args, url, REDIS_URL, "Postgres + Redis")
    print()
    print(
        f"# stream_latency  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine()}; metric commit -> SSE event "
        "received, ms"
    )
    print_table(("service", "clients", "samples", "p50", "p95", "max", "median", "p95<=300"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
