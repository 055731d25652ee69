"""bench/api_load.py --streams N: one tenant's event streams against another tenant's requests (issue
25 finding 7: 200 streams from one key pushed another tenant's `GET /v1/files` from 14 ms to 1.3 s at
the median; goal: at most 2x its unloaded median). Per configuration of the stream limits: tenant B's
`GET /v1/files` latency alone, then with tenant A holding N streams of a queued job open (as many as
the API lets it: the rest get 429), side by side in one run."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx

from bench._service import REDIS_URL, REPO_ROOT, SHAKESPEARE, Service, fresh_postgres_db, serve

# (label, settings): the limits off stand in for the code before them
CONFIGS: tuple[tuple[str, dict[str, str]], ...] = (
    ("limits off (100000 streams a key, 40 poll threads)", {"max_streams_per_key": "100000", "stream_poll_threads": "40"}),
    ("defaults (16 streams a key, 8 poll threads)", {}),
)  # fmt: skip
GOAL = 2.0


@dataclass
class Result:
    label: str
    opened: int
    refused: str
    alone_ms: float
    loaded_ms: float

    @property
    def ratio(self) -> float:
        return self.loaded_ms / self.alone_ms


def second_key(svc: Service) -> str:
    """Another owner's key in the service's database (`fromscratch keys create`)."""
    cmd = [sys.executable, "-m", "cli.main", "keys", "create", "--name", "bench-b"]
    out = subprocess.run(cmd, cwd=REPO_ROOT, env=svc.env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def median_ms(client: httpx.Client, headers: dict[str, str], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.get("/v1/files", headers=headers).raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


@contextmanager
def held_streams(url: str, headers: dict[str, str], n: int) -> Iterator[tuple[int, str]]:
    """n streams opened at once on their own event loop, read until the block ends: (opened, the
    statuses of those refused)."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    counts = {"opened": 0, "refused": 0}
    codes: Counter[int] = Counter()
    ready = threading.Event()

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("GET", url, headers=headers) as r:
            if r.status_code != 200:
                counts["refused"] += 1
                codes[r.status_code] += 1
                return
            counts["opened"] += 1
            async for _ in r.aiter_lines():
                if stop.is_set():
                    return

    async def run() -> None:
        limits = httpx.Limits(max_connections=n + 10)
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as client:
            tasks = [asyncio.create_task(one(client)) for _ in range(n)]
            while counts["opened"] + counts["refused"] < n:
                await asyncio.sleep(0.1)
            ready.set()
            await stop.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    ready.wait(timeout=120)
    try:
        yield counts["opened"], ", ".join(f"{n} x {code}" for code, n in sorted(codes.items())) or "0"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)


def run_config(label: str, limits: dict[str, str], streams: int, samples: int, postgres: bool) -> Result:
    with ExitStack() as stack:
        db = stack.enter_context(fresh_postgres_db()) if postgres else None  # a fresh one per service
        broker = REDIS_URL if postgres else None
        svc = stack.enter_context(serve(database_url=db, broker_url=broker, worker=False, **limits))
        other = {"Authorization": f"Bearer {second_key(svc)}"}
        job_id = svc.create_job(svc.upload(SHAKESPEARE), "llama-tiny", {"max_steps": 1000})  # stays queued
        url = f"{svc.url}/v1/fine_tuning/jobs/{job_id}/stream"
        with httpx.Client(base_url=svc.url, timeout=60) as client:
            median_ms(client, other, 5)  # warm-up
            alone = median_ms(client, other, samples)
            with held_streams(url, svc.headers, streams) as (opened, refused):
                time.sleep(1.0)  # every stream polling
                loaded = median_ms(client, other, samples)
    return Result(label, opened, refused, alone, loaded)


def rows(results: list[Result]) -> list[tuple[str, ...]]:
    return [
        (r.label, str(r.opened), r.refused, f"{r.alone_ms:.1f}", f"{r.loaded_ms:.1f}", f"{r.ratio:.2f}",
         "met" if r.ratio <= GOAL else "NOT met")
        for r in results
    ]  # fmt: skip


HEAD: tuple[str, ...] = (
    "limits",
    "streams open",
    "refused",
    "B p50 ms alone",
    "with A's streams",
    "ratio",
    f"<= {GOAL}",
)


def stream_fairness(streams: int, samples: int, postgres: bool) -> list[Result]:
    return [run_config(label, limits, streams, samples, postgres) for label, limits in CONFIGS]
