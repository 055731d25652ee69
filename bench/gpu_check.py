"""The one command that proves the project's GPU claims, on a machine with a CUDA GPU.

    python3 bench/gpu_check.py --nanogpt PATH --out DIR            # on the GPU box: every step
    python3 bench/gpu_check.py --nanogpt PATH --steps tests,peer   # some of them
    .venv/bin/python bench/gpu_check.py --nanogpt PATH --device cpu --smoke   # the script itself, here

Steps, in this order, each a subprocess with its own time limit whose output is streamed and kept in
DIR/gpu_check.log; a failed or timed-out step is reported and the next one still runs; the exit status
says whether all passed.

1. `machine`: the GPU, its driver and the torch in use (the box's own torch, not our pinned CPU wheel).
2. `peer`: bench/peer.py's `shakespeare-gpu` recipe, nanoGPT's config/train_shakespeare_char.py beside
   ours at the same size, each `--ours` variant against the one nanoGPT curve (issue 21's figure).
3. `tests`: `pytest -m cuda` over the test files that hold CUDA tests (bf16 auto, fused AdamW, TF32,
   the flash kernel, compiled = eager, exact resume on CUDA, the exports of a CUDA-trained checkpoint
   read by transformers, onnxruntime and llama.cpp, dropout inside the flash kernel). Only
   tests/trainer's conftest loads (`--confcutdir`): the suite's root conftest starts PostgreSQL and
   Redis, which a GPU box need not have. A consumer package the box lacks fails its test, by name.
4. `throughput`: bench/trainer_throughput.py on CUDA (llama-42m/110m, compile off/on; one round).
5. `checkpoints`: `fromscratch train` of issue 22's H100 job (llama-110m, ctx 1024, batch 16, 300 steps,
   a checkpoint every 60): its last lines say how long the 4 checkpoints took to write in the
   background (pinned host copies) and how long training waited for them.
6. `inference`: bench/inference_speed.py, llama-110m decoding on the CPU (float32) and on CUDA
   (bfloat16), as the inference worker places it (issue 23's >= 10x).

`--smoke` runs each step as small as it goes (the tests collected, not run; 20 steps of the `overfit`
recipe; throughput's own smoke run) so the script can be checked on a CPU before a GPU's minutes
are spent on it.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
# ours on shakespeare-gpu: dropout as nanoGPT's config has it, evaluated every 100 steps on 40 batches
# (6x the validation text), stopped 6 evaluations past the best; AdamW and Muon
PEER_VARIANTS = [
    "--dropout 0.2 --eval-every 100 --eval-batches 40 --early-stopping-patience 6",
    "--dropout 0.2 --eval-every 100 --eval-batches 40 --early-stopping-patience 6 --optimizer muon",
]
SMOKE_VARIANTS = [
    "--dropout 0.2 --eval-every 10 --eval-batches 2",
    "--dropout 0.2 --eval-every 10 --eval-batches 2 --optimizer muon",
]
STEPS = ("machine", "peer", "tests", "throughput", "checkpoints", "inference")


def cuda_test_files() -> list[str]:
    """The test files that hold a CUDA test, found by their marker (no second list to keep)."""
    return sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if "mark.cuda" in p.read_text()
    )


def commands(args: argparse.Namespace) -> dict[str, tuple[list[str], int]]:
    """Each step's command and its time limit in seconds."""
    py = sys.executable
    machine = (
        "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version());"
        "print('cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0),"
        " 'devices', torch.cuda.device_count(), 'cuda runtime', torch.version.cuda)"
    )
    pytest = [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--confcutdir=tests/trainer"]
    peer = [py, "bench/peer.py", "--nanogpt", str(Path(args.nanogpt or ".").resolve()), "--rounds", "0"]
    recipe = "overfit" if args.smoke else "shakespeare-gpu"  # overfit: the same code at a CPU's size
    peer += ["--recipe", recipe, "--device", args.device, "--iters", str(args.iters)]
    peer += [
        f"--ours={variant}" for variant in args.ours or (SMOKE_VARIANTS if args.smoke else PEER_VARIANTS)
    ]
    if args.data:
        peer += ["--data", str(args.data.resolve())]
    throughput = [py, "bench/trainer_throughput.py", "--device", args.device, "--rounds", "1"]
    if args.smoke:
        throughput = [py, "bench/trainer_throughput.py", "--smoke"]
    data = str((args.data or REPO / "tests" / "data" / "tiny_shakespeare_100k.txt").resolve())
    run_dir = Path(tempfile.gettempdir()) / "fromscratch-gpu-check-checkpoints"  # GBs: not under --out
    size = ["--max-steps", "4", "--checkpoint-every", "1"] if args.smoke else ["--max-steps", "300"]
    checkpoints = [py, "-m", "cli.main", "train", data, "--out", str(run_dir)]
    checkpoints += ["--preset", "llama-tiny" if args.smoke else "llama-110m", "--device", args.device]
    checkpoints += [] if args.smoke else ["--ctx", "1024", "--batch-size", "16", "--checkpoint-every", "60"]
    checkpoints += [*size, "--eval-every", "0", "--samples", "0"]
    inference = [py, "bench/inference_speed.py", *(["--smoke"] if args.smoke else ["--preset", "llama-110m"])]
    return {
        "inference": (inference, 300),
        "checkpoints": (checkpoints, 300),
        "machine": ([py, "-c", machine], 60),
        "tests": (
            [*pytest, *(["-m", "cuda"] if not args.smoke else ["--co"]), *cuda_test_files()],
            args.tests_timeout,
        ),
        "peer": (peer, args.peer_timeout),
        "throughput": (throughput, 300),
    }


def run_step(name: str, cmd: list[str], limit: int, log: TextIO) -> bool:
    """Runs one step, echoing and logging each line; True when it exited 0 within its limit. Lines
    are read on a thread, so a step that goes silent is still stopped at its limit."""

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    say(f"== {name}: {' '.join(cmd)}  (limit {limit} s)")
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=step_env()
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
    while (left := limit - (time.perf_counter() - started)) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:  # the step's output ended: it exited
            code = proc.wait()
            verdict = "passed" if code == 0 else f"FAILED (exit {code})"
            say(f"== {name}: {verdict} in {time.perf_counter() - started:.0f} s")
            return code == 0
        say(line)
    proc.kill()
    proc.wait()
    say(f"== {name}: TIMED OUT after {limit} s")
    return False


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def step_env() -> dict[str, str]:
    """The repo first on the path, then what was there (a GPU box's carried packages)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--nanogpt", type=Path, default=None, help="a nanoGPT checkout (not in this repo); for peer"
    )
    p.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="where gpu_check.log goes")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--data", type=Path, default=None, help="tinyshakespeare.txt (peer.py's default if unset)")
    p.add_argument("--iters", type=int, default=2000, help="peer: steps of each run (nanoGPT's best: 1750)")
    p.add_argument("--ours", action="append", default=None, help="peer: a variant of ours (repeatable)")
    p.add_argument("--peer-timeout", type=int, default=360, help="peer: its time limit in seconds")
    p.add_argument("--tests-timeout", type=int, default=180, help="tests: their time limit in seconds")
    p.add_argument("--smoke", action="store_true", help="each step as small as it goes (checks the script)")
    args = p.parse_args()
    if args.smoke:
        args.iters = min(args.iters, 20)
    steps = [s for s in args.steps.split(",") if s]
    if unknown := set(steps) - set(STEPS):
        raise SystemExit(f"--steps: unknown {sorted(unknown)}; choose from {', '.join(STEPS)}")
    if "peer" in steps and (args.nanogpt is None or not (args.nanogpt / "train.py").exists()):
        raise SystemExit("--nanogpt: the peer step needs a nanoGPT checkout (its train.py)")
    args.out.mkdir(parents=True, exist_ok=True)
    table = commands(args)
    results: dict[str, bool] = {}
    with (args.out / "gpu_check.log").open("a") as log:
        log.write(f"# gpu_check {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
        for name in steps:
            cmd, limit = table[name]
            results[name] = run_step(name, cmd, limit, log)
        summary = "; ".join(f"{name} {'passed' if ok else 'FAILED'}" for name, ok in results.items())
        print(f"== gpu_check: {summary}")
        log.write(f"== gpu_check: {summary}\n")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
