"""API under load while a job trains: `wrk` (a real HTTP load tool; `apt-get install wrk`) with 100
concurrent connections for 20 s on loopback, alternating `GET /v1/fine_tuning/jobs/{id}` and
`GET /v1/fine_tuning/jobs/{id}/metrics?after_step=N`. Prints requests/s, p50/p95/p99 latency, the
error count (must be 0: socket errors, timeouts and non-2xx answers) and the job's training
throughput under load / without it (goal >= 0.9), the unloaded figure being the mean of the
windows just before and just after the load.

    .venv/bin/python bench/api_load.py               # embedded SQLite service
    .venv/bin/python bench/api_load.py --postgres    # Postgres + Redis
    .venv/bin/python bench/api_load.py --smoke       # 10 connections, 2 s
    .venv/bin/python bench/api_load.py --streams 200 [--postgres]   # one tenant's streams vs another's
                                                                       # requests (bench/_stream_fairness.py)

Training throughput in a window is the trainer's per-step tokens/s of the steps whose metric rows
were written in it, time-weighted. The worker's torch runs with --threads threads (default 1, as
the service's tests run it on this 2-core machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._service import (
    REDIS_URL,
    SHAKESPEARE,
    Service,
    fresh_postgres_db,
    machine,
    print_table,
    serve,
)
from bench._stream_fairness import HEAD, rows, stream_fairness

BATCH = 16  # the trained job's batch size (sequences of 128 tokens)
LUA = """
wrk.headers["Authorization"] = "Bearer %(key)s"
local n = 0
request = function()
  n = n + 1
  if n %% 2 == 0 then return wrk.format("GET", "%(job_path)s") end
  return wrk.format("GET", "%(metrics_path)s")
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p95_us": %%d, ' ..
    '"p99_us": %%d, "max_us": %%d, "connect": %%d, "read": %%d, "write": %%d, "status": %%d, "timeout": %%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95), latency:percentile(99),
    latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def window_throughput(points: list[dict[str, Any]], t0: float, t1: float, tokens_per_step: int) -> float:
    rates = [
        float(p["tokens_per_s"])
        for p in points
        if p.get("tokens_per_s") and t0 <= float(p["created_at"]) <= t1
    ]
    if not rates:
        return float("nan")
    return len(rates) * tokens_per_step / sum(tokens_per_step / r for r in rates)


def run_wrk(
    svc: Service, job_id: str, after_step: int, connections: int, seconds: int, threads: int
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(
            LUA
            % {
                "key": svc.api_key,
                "job_path": f"/v1/fine_tuning/jobs/{job_id}",
                "metrics_path": f"/v1/fine_tuning/jobs/{job_id}/metrics?after_step={after_step}",
            }
        )
        script = f.name
    try:
        out = subprocess.run(
            [
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{seconds}s",
                "--timeout",
                "10s",
                "-s",
                script,
                svc.url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=True,
        ).stdout
    finally:
        Path(script).unlink(missing_ok=True)
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--postgres", action="store_true", help="Postgres + Redis instead of embedded SQLite")
    ap.add_argument("--connections", type=int, default=None, help="default 100")
    ap.add_argument("--seconds", type=int, default=None, help="load duration (default 20)")
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the worker (OMP_NUM_THREADS)")
    ap.add_argument(
        "--streams", type=int, default=0, help="instead: N streams of one tenant vs another's requests"
    )
    args = ap.parse_args(argv)
    if args.streams:
        return streams_scenario(args)
    if shutil.which("wrk") is None:
        raise SystemExit("api_load needs wrk: apt-get install wrk")
    conns = args.connections or (10 if args.smoke else 100)
    secs = args.seconds or (2 if args.smoke else 20)
    quiet = 2.0 if args.smoke else 10.0  # unloaded windows before and after

    with contextlib.ExitStack() as stack:
        db = "Postgres + Redis" if args.postgres else "embedded (SQLite)"
        url = stack.enter_context(fresh_postgres_db()) if args.postgres else None
        svc = stack.enter_context(
            serve(database_url=url, broker_url=REDIS_URL if args.postgres else None, threads=args.threads)
        )
        res, points, times = measure(svc, conns, secs, quiet, args.wrk_threads)
    title = (
        f"# api_load  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine()}; {db}; wrk -t{args.wrk_threads} -c{conns} "
        f"-d{secs}s on loopback; job GET + metrics?after_step= alternating; worker torch threads {args.threads}"
    )
    report(res, points, times, title)
    return 0


def streams_scenario(args: argparse.Namespace) -> int:
    """One tenant holds `--streams` event streams open while another lists its files (issue 25, 7)."""
    db = "Postgres + Redis" if args.postgres else "embedded (SQLite)"
    samples = 20 if args.smoke else 100
    results = stream_fairness(args.streams, samples, args.postgres)
    print()
    print(
        f"# api_load --streams  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine()}; {db}; tenant A opens "
        f"{args.streams} streams of a queued job, tenant B: GET /v1/files x{samples}, median"
    )
    print_table(HEAD, rows(results))
    return 0


def measure(
    svc: Service, conns: int, secs: int, quiet: float, wrk_threads: int
) -> tuple[dict[str, Any], list[dict[str, Any]], tuple[float, float, float, float]]:
    """Train a job, then: `quiet` seconds unloaded, wrk's load, `quiet` seconds unloaded again.
    Returns wrk's result, the job's metric points and the windows' bounds t0 < t1 < t2 < t3."""
    file_id = svc.upload(SHAKESPEARE)
    job_id = svc.create_job(
        file_id,
        "llama-tiny",
        {"max_steps": 1_000_000, "batch_size": BATCH, "eval_every": 0, "checkpoint_every": 0},
    )
    deadline = time.monotonic() + 120
    while not svc.metrics(job_id):
        if time.monotonic() > deadline:
            raise SystemExit(f"the job did not start training\n{svc.log_tail()}")
        time.sleep(0.5)
    time.sleep(1.0)
    t0 = time.time()
    time.sleep(quiet)
    t1 = time.time()
    step = int(svc.metrics(job_id)[-1]["step"])
    res = run_wrk(svc, job_id, max(0, step - 10), conns, secs, wrk_threads)
    t2 = time.time()
    time.sleep(quiet + 1.5)  # + the metric flush interval, so the window's rows are written
    t3 = time.time() - 1.5
    points = svc.metrics(job_id)
    svc.client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel")
    return res, points, (t0, t1, t2, t3)


def report(
    res: dict[str, Any], points: list[dict[str, Any]], times: tuple[float, float, float, float], title: str
) -> None:
    t0, t1, t2, t3 = times
    tokens_per_step = BATCH * 128
    before = window_throughput(points, t0, t1, tokens_per_step)
    # +1 s after a window's start: the rows flushed then are from before it
    loaded = window_throughput(points, t1 + 1.0, t2, tokens_per_step)
    after = window_throughput(points, t2 + 1.0, t3, tokens_per_step)
    unloaded = (before + after) / 2
    errors = res["connect"] + res["read"] + res["write"] + res["status"] + res["timeout"]
    rps = res["requests"] / (res["duration_us"] / 1e6)
    print(f"  wrk: {res}", flush=True)
    print(f"  training tok/s: before {before:,.0f}, under load {loaded:,.0f}, after {after:,.0f}", flush=True)
    print()
    print(title)
    print_table(
        (
            "requests/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "errors",
            "train tok/s unloaded",
            "under load",
            "ratio",
            "goals (errors 0 / ratio >= 0.9)",
        ),
        [
            (
                f"{rps:,.0f}",
                f"{res['p50_us'] / 1000:.1f}",
                f"{res['p95_us'] / 1000:.1f}",
                f"{res['p99_us'] / 1000:.1f}",
                f"{res['max_us'] / 1000:.1f}",
                str(errors),
                f"{unloaded:,.0f}",
                f"{loaded:,.0f}",
                f"{loaded / unloaded:.2f}",
                f"{'yes' if errors == 0 else 'NO'} / {'yes' if loaded / unloaded >= 0.9 else 'NO'}",
            )
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
