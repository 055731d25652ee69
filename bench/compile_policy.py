"""compile auto against forced eager and forced compile, end to end (issue 23's goal: auto is never
more than 10% slower to the end of a run than the better of the two, for runs of 30 s, 3 min and
15 min). Each run is a real `fromscratch train` process, timed from its start to its exit (start-up,
compile and checkpoints included); a run's length is set in steps from the eager step time measured
first, so a "3 min" run is one that takes about 3 minutes eager.

    .venv/bin/python bench/compile_policy.py --minutes 0.5,3        # CPU: llama-15m
    python3 bench/compile_policy.py --device cuda --preset llama-110m --ctx 1024 --batch-size 16
    .venv/bin/python bench/compile_policy.py --smoke

Prints the machine, then per length the three wall times and auto / best (goal <= 1.10).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_rows import Row, emit
from bench._service import SHAKESPEARE, machine, print_table
from bench.peer import logged_step_seconds, steady_step_seconds

REPO = Path(__file__).resolve().parent.parent
MODES = {"eager": ["--no-compile"], "compile": ["--compile"], "auto": []}
GOAL = 1.10
UNSTEADY = 6  # steps before steady_step_seconds' first interval (it leaves 5 out)


def train(
    args: argparse.Namespace, steps: int, mode: list[str], metrics: list[dict[str, float]] | None = None
) -> tuple[float, list[str]]:
    """Seconds from the process's start to its exit, and what it said about compiling; the run's
    metrics.jsonl records are appended to `metrics` when one is given."""
    with tempfile.TemporaryDirectory(prefix="fs-bench-compile-") as d:
        out = Path(d) / "run"
        cmd = [sys.executable, "-m", "cli.main", "train", str(args.data), "--out", str(out)]
        cmd += ["--preset", args.preset, "--device", args.device, "--max-steps", str(steps)]
        cmd += ["--eval-every", "0", "--samples", "0", "--checkpoint-every", "0", "--seed", "1", *mode]
        cmd += [
            f"--{k.replace('_', '-')}={v}"
            for k, v in (("ctx", args.ctx), ("batch_size", args.batch_size))
            if v
        ]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        if metrics is not None:
            lines = (out / "metrics.jsonl").read_text().splitlines()
            metrics += map(json.loads, lines)
        said = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if "torch.compile" in line]
        return seconds, said


def eager_step_seconds(args: argparse.Namespace) -> float:
    """The eager step time as the trainer logged it: the steady median (bench.peer) over an eager run
    that logs every step. Not the difference of two runs' walls: start-up (data cache, exports)
    varies by more than a few tiny steps take, and once made that difference ~0."""
    records: list[dict[str, float]] = []
    train(args, UNSTEADY + args.calibration_steps, [*MODES["eager"], "--log-every", "1"], records)
    return steady_step_seconds(logged_step_seconds(records))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", default="0.5,3,15", help="run lengths, eager minutes, comma-separated")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--preset", default="llama-15m")
    ap.add_argument("--ctx", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--data", type=Path, default=SHAKESPEARE)
    ap.add_argument("--calibration-steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--smoke", action="store_true", help="llama-tiny, runs of a few seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.minutes, args.calibration_steps = "llama-tiny", "0.05", 4
    step_s = eager_step_seconds(args)
    print(
        f"# compile_policy  {machine()}; {args.preset} on {args.device}: eager {step_s * 1000:,.0f} ms/step"
    )
    rows, results = [], []
    for minutes in (float(m) for m in args.minutes.split(",")):
        steps = max(6, round(minutes * 60 / step_s))
        walls: dict[str, float] = {}
        for name, mode in MODES.items():
            walls[name], said = train(args, steps, mode)
            print(
                f"  {minutes:g} min ({steps} steps) {name}: {walls[name]:.1f} s  {' | '.join(said)[:1200]}",
                flush=True,
            )
        ratio = walls["auto"] / min(walls["eager"], walls["compile"])
        rows.append((f"{minutes:g}", str(steps), *(f"{walls[m]:.1f}" for m in MODES), f"{ratio:.3f}",
                     "met" if ratio <= GOAL else "NOT met"))  # fmt: skip
        results.append({"minutes": minutes, "steps": steps, **walls, "auto_over_best": ratio})
        label = f"{args.preset} {minutes:g} min run ({args.device}): auto / best of eager, compile"
        emit(Row("compile_policy", label, ratio, "x", f"<= {GOAL}", ratio <= GOAL))
    print_table(("eager min", "steps", "eager s", "compile s", "auto s", "auto/best", f"<= {GOAL}"), rows)
    print(json.dumps({"machine": machine(), "preset": args.preset, "step_s": step_s, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
