"""Service overhead: the same short training run through `fromscratch train` (direct) and through
the service (embedded `fromscratch serve`: SQLite + SQL broker; and Postgres + Redis), interleaved
round by round. Prints service / direct training throughput (goal >= 0.97) and submit -> first loss
latency as a client sees it, net of model start-up (goal <= 2 s embedded, <= 1 s with Redis).

Throughput is tokens over time across the timed steps (the trainer's own per-step tokens/s, from
metrics.jsonl for the direct run and from GET /metrics for jobs, time-weighted so the steps that
pay for metric writes count in full). "Model start-up" is what `train()` takes from its call to
its first logged step when given tokenized data (model build + first step), measured in this
process in the same run; the latency column subtracts it, so what remains is the service's part:
API, broker, claim, validation/tokenization, metric flush and the client's read.

    .venv/bin/python bench/service_overhead.py            # 3 rounds of 150 llama-tiny steps
    .venv/bin/python bench/service_overhead.py --smoke
    .venv/bin/python bench/service_overhead.py --checkpoint-every 10 --batch-size 8   # issue 22's table
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._service import (
    REDIS_URL,
    REPO_ROOT,
    SHAKESPEARE,
    Service,
    fresh_postgres_db,
    machine,
    median,
    print_table,
    serve,
)

PRESET = "llama-tiny"


def throughput(points: list[dict[str, Any]], skip: int, tokens_per_step: int) -> float:
    """Tokens / seconds over the logged steps after the first `skip` (time-weighted)."""
    rates = [float(p["tokens_per_s"]) for p in points if p.get("tokens_per_s") and int(p["step"]) > skip]
    if not rates:
        return float("nan")
    return len(rates) * tokens_per_step / sum(tokens_per_step / r for r in rates)


def hyperparameters(steps: int, batch_size: int) -> dict[str, Any]:
    return {"max_steps": steps, "batch_size": batch_size, "eval_every": 0, "checkpoint_every": 0}


def run_direct(steps: int, batch_size: int, threads: int | None) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="fs-bench-direct-") as d:
        out = Path(d) / "run"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        cmd = [
            sys.executable,
            "-m",
            "cli.main",
            "train",
            str(SHAKESPEARE),
            "--out",
            str(out),
            "--preset",
            PRESET,
            "--max-steps",
            str(steps),
            "--batch-size",
            str(batch_size),
            "--eval-every",
            "0",
            "--checkpoint-every",
            "0",
            "--seed",
            "1337",
        ]
        subprocess.run(
            cmd, cwd=REPO_ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines if x.strip() and "train_loss" in json.loads(x)]


def run_job(
    svc: Service, file_id: str, steps: int, batch_size: int, poll: float
) -> tuple[list[dict[str, Any]], float]:
    """(metrics, seconds from submit to the first loss visible through GET /metrics)."""
    t0 = time.perf_counter()
    job_id = svc.create_job(file_id, PRESET, hyperparameters(steps, batch_size))
    first = float("nan")
    with httpx.Client(base_url=svc.url, headers=svc.headers, timeout=30) as c:
        while True:
            r = c.get(f"/v1/fine_tuning/jobs/{job_id}/metrics", params={"limit": 1})
            r.raise_for_status()
            body = r.json()
            if any(p.get("train_loss") is not None for p in body["data"]):
                first = time.perf_counter() - t0
                break
            if body["job_status"] in ("failed", "cancelled"):
                raise RuntimeError(f"job {job_id} {body['job_status']}\n{svc.log_tail()}")
            if time.perf_counter() - t0 > 300:
                raise TimeoutError(f"no loss from job {job_id} after 300 s\n{svc.log_tail()}")
            time.sleep(poll)
    # then as a watching client does: a status read a second (the dashboard reads every 2 s), so
    # the figure is the service's cost, not that of a client polling the API 5 times a second
    svc.wait_job(job_id, poll=1.0)
    return svc.metrics(job_id), first


def model_startup(batch_size: int, threads: int | None) -> float:
    """Seconds from train(tokenized data) to its first logged step, in this process."""
    import torch

    from trainer.config import TrainConfig, model_config_from_preset
    from trainer.config.metrics import StepMetrics
    from trainer.data.prepare import prepare_data
    from trainer.data.tokenizers import ByteTokenizer
    from trainer.run.loop import train
    from trainer.run.report import Callbacks

    if threads:
        torch.set_num_threads(threads)
    tok = ByteTokenizer()
    times: list[float] = []

    class First(Callbacks):
        def __init__(self) -> None:
            self.t: float | None = None

        def on_step(self, metrics: StepMetrics) -> None:
            self.t = self.t or time.perf_counter()

        def should_stop(self) -> Any:
            return "stop" if self.t else None

    with tempfile.TemporaryDirectory(prefix="fs-bench-startup-") as d:
        data = prepare_data(SHAKESPEARE, tok, cache_dir=Path(d) / "cache")
        for i in range(3):
            cb = First()
            t0 = time.perf_counter()
            train(
                model_config_from_preset(PRESET),
                TrainConfig(max_steps=10, batch_size=batch_size, eval_every=0, checkpoint_every=0),
                data,
                Path(d) / f"r{i}",
                cb,
                tokenizer=tok,
            )
            assert cb.t is not None
            times.append(cb.t - t0)
    return median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one round of a few steps, embedded service only")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default 150)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--skip", type=int, default=None, help="first steps left out of throughput (default 5)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for trainer and worker")
    ap.add_argument("--no-postgres", action="store_true", help="embedded service only")
    ap.add_argument("--poll", type=float, default=0.05, help="client poll interval for the first loss (s)")
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="instead: wall time of a llama-42m job checkpointing every N steps, direct vs service per "
        "backend (bench/_checkpoint_wall.py; --steps default 40, --rounds default 1)",
    )
    ap.add_argument(
        "--backend", action="append", choices=("fs", "s3", "db"), help="with --checkpoint-every (repeatable)"
    )
    args = ap.parse_args(argv)
    if args.checkpoint_every:
        from bench import _checkpoint_wall

        return _checkpoint_wall.main(args)
    rounds = args.rounds or 1 if args.smoke else args.rounds or 3
    steps = args.steps or (8 if args.smoke else 150)
    skip = args.skip if args.skip is not None else (2 if args.smoke else 5)
    use_pg = not (args.no_postgres or args.smoke)

    startup = model_startup(args.batch_size, args.threads)
    print(f"service_overhead: model start-up (train() to first step) {startup:.2f} s", flush=True)
    with contextlib.ExitStack() as stack:
        services: dict[str, Service] = {"embedded (SQLite)": stack.enter_context(serve(threads=args.threads))}
        if use_pg:
            url = stack.enter_context(fresh_postgres_db())
            services["Postgres + Redis"] = stack.enter_context(
                serve(database_url=url, broker_url=REDIS_URL, threads=args.threads)
            )
        direct, results = run_rounds(services, args, rounds, steps, skip)

    print()
    print(
        f"# service_overhead  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine()}; {PRESET}, {steps} steps x "
        f"{args.batch_size * 128} tokens, medians of {rounds} interleaved rounds; model start-up {startup:.2f} s"
    )
    report(direct, results, startup)
    return 0


def run_rounds(
    services: dict[str, Service], args: argparse.Namespace, rounds: int, steps: int, skip: int
) -> tuple[list[float], dict[str, dict[str, list[float]]]]:
    """Each round: the direct run, then a job on each service. Returns the direct throughputs and,
    per service, its throughputs ("tps"), their ratios to the round's direct one and first-loss times."""
    tokens_per_step = args.batch_size * 128  # llama-tiny ctx
    direct: list[float] = []
    results: dict[str, dict[str, list[float]]] = {}
    files = {name: svc.upload(SHAKESPEARE) for name, svc in services.items()}
    for rnd in range(rounds):
        d = throughput(run_direct(steps, args.batch_size, args.threads), skip, tokens_per_step)
        direct.append(d)
        print(f"  round {rnd + 1}/{rounds} direct {d:,.0f} tok/s", flush=True)
        for name, svc in services.items():
            points, first = run_job(svc, files[name], steps, args.batch_size, args.poll)
            s = throughput(points, skip, tokens_per_step)
            r = results.setdefault(name, {"tps": [], "ratio": [], "first": []})
            r["tps"].append(s)
            r["ratio"].append(s / d)
            r["first"].append(first)
            print(
                f"  round {rnd + 1}/{rounds} {name}: {s:,.0f} tok/s (x{s / d:.3f} of direct), first loss "
                f"after {first:.2f} s",
                flush=True,
            )
    return direct, results


def report(direct: list[float], results: dict[str, dict[str, list[float]]], startup: float) -> None:
    rows = [("direct (fromscratch train)", f"{median(direct):,.0f}", "1.000", "-", "-", "-")]
    for name, r in results.items():
        goal = 2.0 if "SQLite" in name else 1.0
        net = median(r["first"]) - startup
        rows.append(
            (
                name,
                f"{median(r['tps']):,.0f}",
                f"{median(r['ratio']):.3f}",
                f"{median(r['first']):.2f}",
                f"{net:.2f}",
                f"{'yes' if median(r['ratio']) >= 0.97 else 'NO'} / {'yes' if net <= goal else 'NO'}"
                f" (<= {goal:.0f} s)",
            )
        )
    print_table(
        ("run", "tok/s", "x direct", "first loss s", "net of start-up s", "goals met (tput / latency)"), rows
    )


if __name__ == "__main__":
    sys.exit(main())
