"""Checkpoint overhead (issue 22): the wall time of one job with 4 checkpoints and the default exports,
through `fromscratch train` and through the embedded service on each blob backend, interleaved round
by round; what the training loop waited for its checkpoints beside the time they took to write and
upload in the background; and how much the database grew per job. `bench/service_overhead.py
--checkpoint-every N [--backend fs --backend s3 --backend db]` runs it.

Goals: service / direct wall time <= 1.10 on each backend; the loop's cost (its waits, and its steps
slowed past those of a baseline run without checkpoints) <= 5% of the checkpoints' time in the
background (write + upload); database growth <= 1 MB per job on fs and s3 (db: comparison only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._service import REPO_ROOT, SHAKESPEARE, Service, environ, machine, median, print_table, serve

PRESET, CTX = "llama-42m", 256
# the line `fromscratch train` ends with (trainer.run.checkpoint_writer.CheckpointTimes.summary)
SUMMARY = re.compile(r"(\d+) checkpoints .* in the background in ([\d.]+) s; training waited ([\d.]+) s")


@dataclass
class Run:
    wall: float  # seconds, submit (or process start) to the job's end with its exports
    write: float  # seconds the checkpoints took on the background threads (write, and upload)
    waited: float  # seconds the training loop waited for them (snapshots, a write in flight)
    train: float  # seconds the training steps took (what the trainer's tokens/s covers)
    db_growth: int | None = None  # bytes the service's database grew by (None: direct)


def train_seconds(points: list[dict[str, Any]], tokens_per_step: int) -> float:
    """The steps' own time, from the logged tokens/s (which leaves out evaluating and checkpointing):
    steps slowed by a checkpoint written beside them show up here."""
    total, last = 0.0, 0
    for p in sorted((p for p in points if p.get("tokens_per_s")), key=lambda p: int(p["step"])):
        step = int(p["step"])
        total += (step - last) * tokens_per_step / float(p["tokens_per_s"])
        last = step
    return total


def hyperparameters(steps: int, every: int, batch_size: int) -> dict[str, Any]:
    return {
        "max_steps": steps,
        "batch_size": batch_size,
        "eval_every": 0,
        "checkpoint_every": every,
        "ctx": CTX,
    }


def run_direct(steps: int, every: int, batch_size: int, env: dict[str, str]) -> Run:
    """`fromscratch train` of the job (every 0: no checkpoints, the baseline of the steps' time)."""
    with tempfile.TemporaryDirectory(prefix="fs-bench-ckpt-direct-") as d:
        cmd = [sys.executable, "-m", "cli.main", "train", str(SHAKESPEARE), "--out", str(Path(d) / "run")]
        cmd += [
            "--preset",
            PRESET,
            "--ctx",
            str(CTX),
            "--max-steps",
            str(steps),
            "--batch-size",
            str(batch_size),
        ]
        cmd += ["--eval-every", "0", "--checkpoint-every", str(every), "--seed", "1337", "--samples", "0"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        lines = (Path(d) / "run" / "metrics.jsonl").read_text().splitlines()
    train = train_seconds([json.loads(line) for line in lines if line.strip()], batch_size * CTX)
    found = SUMMARY.search(done.stdout)
    if found is None and every:
        raise RuntimeError(
            f"no checkpoint summary in the output of fromscratch train:\n{done.stdout[-2000:]}"
        )
    write, waited = (float(found.group(2)), float(found.group(3))) if found else (0.0, 0.0)
    return Run(wall, write, waited, train)


def sqlite_bytes(svc: Service) -> int:
    """The embedded database's size in use (pages minus free pages, the WAL's pages included)."""
    url = svc.env.get("FROMSCRATCH_DATABASE_URL") or f"sqlite:///{svc.data_dir / 'fromscratch.db'}"
    path = url.split("///", 1)[1]
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        pages, free, size = (
            db.execute(f"pragma {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
        )
    return int((pages - free) * size)


def run_service(svc: Service, file_id: str, steps: int, every: int, batch_size: int) -> Run:
    before = sqlite_bytes(svc)
    t0 = time.perf_counter()
    job_id = svc.create_job(file_id, PRESET, hyperparameters(steps, every, batch_size))
    job = svc.wait_job(job_id, timeout=3600, poll=0.1)
    wall = time.perf_counter() - t0
    if job["status"] != "succeeded":
        raise RuntimeError(f"job {job_id} {job['status']}\n{svc.log_tail()}")
    costs = checkpoint_event(svc, job_id)
    write = float(costs["write_seconds"]) + float(costs["upload_seconds"])
    train = train_seconds(svc.metrics(job_id), batch_size * CTX)
    return Run(wall, write, float(costs["stall_seconds"]), train, sqlite_bytes(svc) - before)


def checkpoint_event(svc: Service, job_id: str) -> dict[str, Any]:
    r = svc.client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100})
    r.raise_for_status()
    for event in r.json()["data"]:
        if event["message"].startswith("Checkpoints in the background"):
            return dict(event["data"])
    raise RuntimeError(f"job {job_id} has no checkpoint-costs event\n{svc.log_tail()}")


@contextlib.contextmanager
def backend_service(backend: str, threads: int | None) -> Iterator[Service]:
    """The embedded service (SQLite, SQL broker) storing blobs on `backend`; s3: a throwaway SeaweedFS."""
    if backend != "s3":
        with serve(blob_backend=backend, threads=threads) as svc:
            yield svc
        return
    from tests.fixtures.seaweedfs import start_seaweedfs

    root = Path(tempfile.mkdtemp(prefix="fs-bench-weed-"))
    weed = start_seaweedfs(root)
    try:
        with (
            environ(weed.env()),
            serve(
                blob_backend="s3", threads=threads, s3_endpoint_url=weed.endpoint_url, s3_bucket=weed.bucket
            ) as svc,
        ):
            yield svc
    finally:
        weed.destroy()


def main(args: argparse.Namespace) -> int:
    backends = args.backend or ["fs", "s3", "db"]
    steps, every, rounds = args.steps or 40, args.checkpoint_every, args.rounds or 1
    runs: dict[str, list[Run]] = {name: [] for name in ["baseline", "direct", *backends]}
    with contextlib.ExitStack() as stack:
        services = {b: stack.enter_context(backend_service(b, args.threads)) for b in backends}
        files = {b: svc.upload(SHAKESPEARE) for b, svc in services.items()}
        env = next(iter(services.values())).env  # the same threads and PYTHONPATH for the direct runs
        for rnd in range(rounds):
            for name in runs:
                if name in services:
                    run = run_service(services[name], files[name], steps, every, args.batch_size)
                else:
                    run = run_direct(steps, every if name == "direct" else 0, args.batch_size, env)
                runs[name].append(run)
                print(
                    f"  round {rnd + 1}/{rounds} {name}: {run.wall:.1f} s, steps {run.train:.1f} s",
                    flush=True,
                )
    print()
    print(
        f"# checkpoint overhead  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine()}; {PRESET} ctx {CTX}, "
        f"{steps} steps x {args.batch_size * CTX} tokens, a checkpoint every {every} steps, default exports; "
        f"medians of {rounds} interleaved rounds"
    )
    report(runs)
    return 0


def report(runs: dict[str, list[Run]]) -> None:
    """One row per run: wall time and its ratio to `fromscratch train`'s; the checkpoints' time in
    the background; the loop's cost, as waits plus steps slowed (their time past the baseline run's,
    which writes no checkpoint), and that as a share of the background time; database growth."""
    med = {
        name: Run(*(median([getattr(r, f) for r in rs]) for f in ("wall", "write", "waited", "train")))
        for name, rs in runs.items()
    }
    growth = {name: median([float(r.db_growth or 0) for r in rs]) for name, rs in runs.items()}
    direct, base = med["direct"], med["baseline"]
    rows = []
    for name, m in med.items():
        slowed = m.train - base.train
        cost = m.waited + slowed
        service = name not in ("baseline", "direct")
        goals = [m.wall / direct.wall <= 1.10, cost <= 0.05 * m.write] + (
            [growth[name] <= 1e6] if name in ("fs", "s3") else []
        )
        rows.append(
            (
                f"service, {name} backend" if service else f"{name} (fromscratch train)",
                f"{m.wall:.1f}",
                f"{m.wall / direct.wall:.3f}",
                f"{m.write:.2f}",
                f"{m.waited:.2f}",
                f"{slowed:+.2f}",
                _pct(cost, m.write) if m.write else "-",
                f"{growth[name] / 1e6:.2f}" if service else "-",
                ("yes" if all(goals) else "NO") if m.write else "-",
            )
        )
    head = (
        "run",
        "wall s",
        "x direct",
        "ckpt bg s",
        "loop waits s",
        "steps slowed s",
        "loop cost %",
        "db growth MB",
        "goals met",
    )
    print_table(head, rows)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}" if whole > 0 else "-"
