"""Tokens/s of `fromscratch train` with 1 and with 2 data-parallel processes on this machine (issue 12).

    .venv/bin/python bench/devices.py                 # CPU, 3 interleaved rounds
    .venv/bin/python bench/devices.py --device cuda   # needs 2 GPUs
    .venv/bin/python bench/devices.py --smoke         # seconds: a tiny model, one round

Each round runs the real CLI once with `--devices 1` and once with `--devices 2` (the same global
batch: 2 processes x batch b against 1 process x batch 2b, so the same windows per step) and reads the
steady-state step times from metrics.jsonl (steps 5 on). Printed: tokens/s of each and their ratio,
per round and the median. On a CPU with 2 cores two processes share the cores one process already
used: expect no speed-up there; the figure shows what the process group and gradient all-reduce cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._throughput_report import machine_description  # noqa: E402
from bench.peer import logged_step_seconds, steady_step_seconds  # noqa: E402

MODEL = ["--n-layer", "4", "--n-head", "4", "--n-embd", "256", "--ctx", "128"]
SMOKE_MODEL = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--ctx", "128"]
TEST_CORPUS = REPO / "tests" / "data" / "tiny_shakespeare_100k.txt"


def steady_tokens_per_s(out: Path, tokens_per_step: int) -> float:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return tokens_per_step / steady_step_seconds(logged_step_seconds(records))


def run(
    corpus: Path, out: Path, devices: int, batch: int, steps: int, device: str, model: list[str]
) -> float:
    args = [
        *model,
        *("--batch-size", str(batch), "--devices", str(devices), "--max-steps", str(steps)),
        *("--eval-every", "0", "--checkpoint-every", "0", "--export-formats", "none", "--samples", "0"),
        *("--device", device, "--dtype", "float32" if device == "cpu" else "auto", "--no-compile"),
        *("--log-every", "1"),
    ]
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "train", str(corpus), "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=os.environ,
    )
    if r.returncode != 0:
        raise SystemExit(f"devices={devices} failed:\n{r.stderr[-3000:]}")
    return steady_tokens_per_s(out, batch * devices * 128)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "tinyshakespeare.txt")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences per step)")
    p.add_argument("--smoke", action="store_true", help="a tiny model, one round of 8 steps (seconds)")
    args = p.parse_args()
    import torch

    model = SMOKE_MODEL if args.smoke else MODEL
    rounds, steps = (1, 8) if args.smoke else (args.rounds, args.steps)
    corpus = TEST_CORPUS if args.smoke or not args.data.exists() else args.data
    print(
        f"# devices  {time.strftime('%Y-%m-%d %H:%M')} UTC  {machine_description(torch.device(args.device))}"
    )
    print(f"# global batch {args.batch} x 128 tokens; steady step times from metrics.jsonl (steps 5 on)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="fromscratch-devices-") as tmp:
        for i in range(rounds):
            one = run(corpus, Path(tmp, f"one-{i}"), 1, args.batch, steps, args.device, model)
            two = run(corpus, Path(tmp, f"two-{i}"), 2, args.batch // 2, steps, args.device, model)
            rows.append((f"round {i + 1}", one, two))
    ratios = [two / one for _, one, two in rows]
    print(f"{'run':<10}{'devices 1 tok/s':>17}{'devices 2 tok/s':>17}{'ratio':>8}")
    print("-" * 52)
    for name, one, two in rows:
        print(f"{name:<10}{one:>17,.0f}{two:>17,.0f}{two / one:>7.2f}x")
    print(f"{'median':<10}{'':>17}{'':>17}{statistics.median(ratios):>7.2f}x")


if __name__ == "__main__":
    main()
