"""A CPU run's thread count from measurement (trainer/run/cpu_threads.py) against the count fixed at
one thread per core, with the machine to itself and with other processes keeping cores busy.

Each run is a whole `fromscratch train` of llama-tiny (no evaluation, no exports), timed from start
to exit; "fixed" sets OMP_NUM_THREADS to the core count (torch's default, which the tuner does not
touch), "measured" leaves it unset. The busy runs start `--busy` processes spinning on a core each
beside the run. Runs of the two kinds alternate, so both see the same machine.

    python bench/cpu_threads.py [--steps N] [--busy K] [--rounds R]   # --smoke: a few steps
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "tests" / "data" / "tiny_shakespeare_100k.txt"
SPIN = "while True: pass"


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def timed_run(steps: int, fixed: bool, busy: int, out: Path) -> float:
    """Seconds one `fromscratch train` took, with `busy` spinning processes beside it."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and not k.startswith("FROMSCRATCH_")}
    if fixed:
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    cmd = [sys.executable, "-m", "cli.main", "train", str(DATA), "--out", str(out), "--preset", "llama-tiny"]
    cmd += ["--max-steps", str(steps), "--eval-every", "0", "--samples", "0", "--export-formats", ""]
    try:
        started = time.perf_counter()
        proc = subprocess.run(cmd + ["--no-compile"], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
        took = time.perf_counter() - started
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    if proc.returncode != 0:
        raise SystemExit(f"train failed:\n{proc.stderr[-2000:]}")
    changes = [line for line in proc.stdout.splitlines() if "cpu threads" in line]
    for line in changes:
        print(f"    {'fixed' if fixed else 'measured'} busy={busy}: {line.strip()[:200]}", flush=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000, help="training steps per run (default 3000)")
    ap.add_argument("--busy", type=int, default=1, help="spinning processes in the busy runs (default 1)")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    ap.add_argument("--smoke", action="store_true", help="a few steps, one round")
    args = ap.parse_args()
    steps, rounds = (5, 1) if args.smoke else (args.steps, args.rounds)
    print(
        f"# cpu_threads  {time.strftime('%Y-%m-%d %H:%M')}  {machine()}; llama-tiny, {steps} steps",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for busy in sorted({0, args.busy}):
            times: dict[bool, list[float]] = {True: [], False: []}
            for r in range(rounds):
                for fixed in (True, False):
                    out = Path(tmp) / f"b{busy}-r{r}-{'fixed' if fixed else 'measured'}"
                    times[fixed].append(timed_run(steps, fixed, busy, out))
            fixed_s, measured_s = statistics.median(times[True]), statistics.median(times[False])
            rows.append((busy, fixed_s, measured_s, fixed_s / measured_s))
    print(f"{'busy':<4}  {'fixed s':>8}  {'measured s':>10}  {'speed-up':>8}")
    print(f"{'-' * 4}  {'-' * 8}  {'-' * 10}  {'-' * 8}")
    for busy, fixed_s, measured_s, ratio in rows:
        print(f"{busy:<4}  {fixed_s:8.1f}  {measured_s:10.1f}  {ratio:8.2f}")


if __name__ == "__main__":
    main()
