"""The one command that proves the project's GPU claims, on a machine with a CUDA GPU.

    python3 bench/gpu_check.py --nanogpt PATH --out DIR            # on the GPU box: the default steps
    python3 bench/gpu_check.py --nanogpt PATH --steps tests,peer   # some of them
    .venv/bin/python bench/gpu_check.py --nanogpt PATH --device cpu --smoke   # the script itself, here

A box without network needs the service's packages and nanoGPT carried to it: bench/gpu_carry.py
prepares both here and prints the device call that installs them and runs this.

Steps, in this order, each a subprocess with its own time limit whose output is streamed and kept in
DIR/gpu_check.log; a failed or timed-out step is reported and the next one still runs; the exit status
says whether all passed. At the end it prints one table of every figure the steps measured (each
step prints its figures as GPU_CHECK_ROW lines, bench/_gpu_rows.py), with the issue's goals and
whether they are met, and writes it to DIR/gpu_check.json. On 2026-11-27 an H100 took: machine
6 s, kernels 16, nanogpt 52, inference 30, tests 94, service 57, and throughput ran out of its then
300 s (each timed run wrote a stop checkpoint, 14 GB at 1.2B; no longer), so checkpoints became
opt-in, and so is `profile` (a diagnosis, no claim). That call ran past the device tool's 10
minutes and never printed its table. Now the call has a clock (`--minutes`, 9.5 on cuda by
default; bench/_gpu_deadline.py): each step keeps, for the steps after it, the time they took that
day, a step left less than half its own is reported NOT RUN, and throughput is given what remains
as a budget, its runs ordered so the issue's figures come first (bench/_run_plan.py).

1. `machine`: the GPU, its driver and the torch in use (the box's own torch, not our pinned CPU wheel).
2. `peer` (only when named in --steps): bench/peer.py's `shakespeare-gpu` recipe, nanoGPT's config/train_shakespeare_char.py beside
   ours at the same size, each `--ours` variant against the one nanoGPT curve (issue 21's figure).
3. `tests`: `pytest -m cuda` over the test files that hold CUDA tests (bf16 auto, fused AdamW, TF32,
   the flash kernel, compiled = eager, exact resume on CUDA, the exports of a CUDA-trained checkpoint
   read by transformers, onnxruntime and llama.cpp, dropout inside the flash kernel). Only
   tests/trainer's conftest loads (`--confcutdir`): the suite's root conftest starts PostgreSQL and
   Redis, which a GPU box need not have. A consumer package the box lacks fails its test, by name.
4. `kernels`: bench/kernel_speed.py, each fused Triton kernel of the eager step (RMSNorm, the q/k/v
   split with RoPE, SwiGLU, forward and backward; one chunk of the fused loss's cross-entropy at
   nanoGPT's vocabulary) at llama-110m's training shape: its share of a
   device copy's bandwidth, its speed over the torch-op form, its largest difference from it, and
   every candidate tile's time where the step picks one by timing (trainer/model/kernel_tiles.py).
5. `throughput`: bench/trainer_throughput.py on CUDA (llama-42m/110m at ctx 1024, a 1.2B llama at
   ctx 2048; compile off/on, eager with the Triton kernels and with torch ops; one round): tokens/s, TFLOP/s, MFU against the matmul peak measured
   beside it and against the GPU's datasheet, peak memory against the trainer's estimate.
   `nanogpt` (with --nanogpt): nanoGPT's own bench.py eager and compiled (bench/nanogpt_bench.py);
   the table divides our llama-110m's FLOP rate by its (the issue's goals), and beside them that of
   llama-110m at nanoGPT's vocabulary (50304; throughput's -v50k config), the like-for-like rate.
   `profile` (only when named in --steps): bench/profile_step.py --loop, llama-110m's eager step in the trainer's own loop at
   vocabularies 258 and 50304: its wall time against the kernel time in it (a step that takes much
   longer than its kernels waits on the host), and where the kernel time goes.
6. `checkpoints` (only when named in --steps): `fromscratch train` of issue 22's H100 job (llama-110m, ctx 1024, batch 16, 300 steps,
   a checkpoint every 60): its last lines say how long the 4 checkpoints took to write in the
   background (pinned host copies) and how long training waited for them.
7. `inference`: bench/inference_speed.py, llama-110m decoding on the CPU (float32) and on CUDA
   (bfloat16), as the inference worker places it (issue 23's >= 10x).
8. `service`: bench/gpu_service.py: `fromscratch serve` with no device setting, a job without
   `device` (placed on the gpu queue?), its background checkpoints, a completion (decoded on CUDA?).
9. `compile_policy` (only when named in --steps): bench/compile_policy.py on llama-110m, compile auto
   against forced eager and forced compile, end to end, for runs of --policy-minutes (goal: auto /
   best <= 1.10). Three runs per length: "0.5,3" takes about 12 minutes, beyond one 10-minute call.

`--smoke` runs each step as small as it goes (the tests collected, not run; 20 steps of the `overfit`
recipe; the kernels at a tiny shape in Triton's interpreter; throughput's own smoke run) so the
script can be checked on a CPU before a GPU's minutes are spent on it.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_deadline import Deadline
from bench._gpu_rows import Row, table_lines
from bench._gpu_summary import nanogpt_ratios, step_rows, write_json

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
STEPS = (
    "machine", "peer", "tests", "kernels", "throughput", "profile", "nanogpt", "checkpoints", "inference",
    "service", "compile_policy",
)  # fmt: skip
DEFAULT_MINUTES = 9.5
OPT_IN = {"peer", "profile", "checkpoints", "compile_policy"}  # run only when named in --steps


def cuda_test_files() -> list[str]:
    """The test files that hold a CUDA test, found by their marker (no second list to keep)."""
    return sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if "mark.cuda" in p.read_text()
    )


MACHINE = (
    "import torch, platform; from bench._gpu_rows import Row, emit;"
    "gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device';"
    "print('torch', torch.__version__, 'python', platform.python_version(), 'cuda runtime', torch.version.cuda);"
    "emit(Row('machine', 'device', f'{gpu} x{torch.cuda.device_count()}'));"
    "emit(Row('machine', 'torch', torch.__version__))"
)


def peer_command(args: argparse.Namespace) -> list[str]:
    peer = [sys.executable, "bench/peer.py", "--nanogpt", str(Path(args.nanogpt or ".").resolve())]
    recipe = "overfit" if args.smoke else "shakespeare-gpu"  # overfit: the same code at a CPU's size
    peer += ["--rounds", "0", "--recipe", recipe, "--device", args.device, "--iters", str(args.iters)]
    peer += [f"--ours={v}" for v in args.ours or (SMOKE_VARIANTS if args.smoke else PEER_VARIANTS)]
    return peer + (["--data", str(args.data.resolve())] if args.data else [])


def checkpoints_command(args: argparse.Namespace) -> list[str]:
    data = str((args.data or REPO / "tests" / "data" / "tiny_shakespeare_100k.txt").resolve())
    run_dir = args.scratch / "checkpoints"  # GBs: not under --out
    size = ["--max-steps", "4", "--checkpoint-every", "1"] if args.smoke else ["--max-steps", "300"]
    cmd = [sys.executable, "-m", "cli.main", "train", data, "--out", str(run_dir)]
    cmd += ["--preset", "llama-tiny" if args.smoke else "llama-110m", "--device", args.device]
    cmd += [] if args.smoke else ["--ctx", "1024", "--batch-size", "16", "--checkpoint-every", "60"]
    return cmd + [*size, "--eval-every", "0", "--samples", "0"]


def commands(args: argparse.Namespace) -> dict[str, tuple[list[str], int]]:
    """Each step's command and its time limit in seconds."""
    py = sys.executable
    smoke = ["--smoke"] if args.smoke else []
    pytest = [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--confcutdir=tests/trainer"]
    full = ["--device", args.device, "--rounds", "1", "--kernels-ab"]  # eager: Triton and torch ops
    throughput = [py, "bench/trainer_throughput.py", *(smoke or full)]
    nanogpt = [py, "bench/nanogpt_bench.py", "--nanogpt", str(Path(args.nanogpt or ".").resolve())]
    service = [py, "bench/gpu_service.py", "--device", args.device, *smoke]
    profile = ["--loop", "--vocab", "258,50304", "--rows", "30", *smoke]
    policy = [py, "bench/compile_policy.py", "--device", args.device, "--minutes", args.policy_minutes]
    policy += smoke or ["--preset", "llama-110m", "--ctx", "1024", "--batch-size", "16"]
    # three runs per length (eager, compile, auto), each about that long eager, plus start-ups
    policy_limit = 120 + round(3 * 60 * 1.5 * sum(float(m) for m in args.policy_minutes.split(",")))
    return {
        "machine": ([py, "-c", MACHINE], 60),
        "peer": (peer_command(args), args.peer_timeout),
        "tests": (
            # the slowest tests named: the step took 94 s of a 10-minute call on an H100
            [*pytest, *(["-m", "cuda", "--durations=8"] if not args.smoke else ["--co"]), *cuda_test_files()],
            args.tests_timeout,
        ),
        "kernels": ([py, "bench/kernel_speed.py", *smoke], 180),
        "throughput": (throughput, 450),  # 420 s, and the late-reads A/B's run
        "profile": ([py, "bench/profile_step.py", "--device", args.device, *profile], 120),
        "nanogpt": (nanogpt, 300),
        "checkpoints": (checkpoints_command(args), 300),
        "inference": ([py, "bench/inference_speed.py", *(smoke or ["--preset", "llama-110m"])], 300),
        "service": (service, 300),
        "compile_policy": (policy, policy_limit),
    }


@dataclass
class StepResult:
    passed: bool
    seconds: float
    lines: list[str] = field(default_factory=list)
    ran: bool = True  # False: the call's --minutes left too little for it

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "FAILED" if self.ran else "NOT RUN"


def run_step(name: str, cmd: list[str], limit: int, log: TextIO) -> StepResult:
    """Runs one step, echoing and logging each line; passed when it exited 0 within its limit. Lines
    are read on a thread, so a step that goes silent is still stopped at its limit."""
    say = functools.partial(say_and_log, log)
    say(f"== {name}: {' '.join(cmd)}  (limit {limit} s)")
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=step_env()
    )
    lines: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []
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
            return StepResult(code == 0, time.perf_counter() - started, seen)
        seen.append(line)
        say(line)
    proc.kill()
    proc.wait()
    say(f"== {name}: TIMED OUT after {limit} s")
    return StepResult(False, time.perf_counter() - started, seen)


def say_and_log(log: TextIO, line: str) -> None:
    print(line, flush=True)
    log.write(line + "\n")
    log.flush()


def not_run(name: str, deadline: Deadline, log: TextIO) -> StepResult:
    left = deadline.call.left()
    say_and_log(log, f"== {name}: NOT RUN, {left:.0f} s left of the call's {deadline.minutes} minutes")
    return StepResult(False, 0.0, ran=False)


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def step_env() -> dict[str, str]:
    """The repo first on the path, then what was there (a GPU box's carried packages)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout (not in this repo)")
    p.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="where the log and JSON go")
    p.add_argument(
        "--steps", default=None, help=f"comma-separated, of {', '.join(STEPS)} (default: all but peer)"
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--data", type=Path, default=None, help="tinyshakespeare.txt (peer.py's default if unset)")
    p.add_argument("--iters", type=int, default=2000, help="peer: steps of each run (nanoGPT's best: 1750)")
    p.add_argument("--ours", action="append", default=None, help="peer: a variant of ours (repeatable)")
    p.add_argument("--peer-timeout", type=int, default=360, help="peer: its time limit in seconds")
    p.add_argument("--tests-timeout", type=int, default=180, help="tests: their time limit in seconds")
    p.add_argument(
        "--policy-minutes",
        default="0.5,3",
        help="compile_policy: run lengths in eager minutes (comma-separated)",
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="the whole call's time: steps cut to fit, the table printed within it (default: 9.5 on "
        "cuda, the device tool's 10-minute call less its set-up; none with --smoke or on cpu)",
    )
    p.add_argument("--smoke", action="store_true", help="each step as small as it goes (checks the script)")
    args = p.parse_args()
    if args.minutes is None and args.device == "cuda" and not args.smoke:
        args.minutes = DEFAULT_MINUTES
    args.deadline = Deadline(args.minutes, smoke=args.smoke)
    if args.smoke:
        args.iters = min(args.iters, 20)
    if args.steps is None:
        skip = OPT_IN | (set() if args.nanogpt else {"nanogpt"})
        args.steps = ",".join(s for s in STEPS if s not in skip)
    args.steps = [s for s in args.steps.split(",") if s]
    if unknown := set(args.steps) - set(STEPS):
        raise SystemExit(f"--steps: unknown {sorted(unknown)}; choose from {', '.join(STEPS)}")
    if "peer" in args.steps and (args.nanogpt is None or not (args.nanogpt / "train.py").exists()):
        raise SystemExit("--nanogpt: the peer step needs a nanoGPT checkout (its train.py)")
    if "nanogpt" in args.steps and (args.nanogpt is None or not (args.nanogpt / "bench.py").exists()):
        raise SystemExit("--nanogpt: the nanogpt step needs a nanoGPT checkout (its bench.py)")
    return args


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.scratch = Path(tempfile.mkdtemp(prefix="fromscratch-gpu-check-"))  # removed at the end
    try:
        return run_steps(args)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)


def run_steps(args: argparse.Namespace) -> int:
    table = commands(args)
    results: dict[str, StepResult] = {}
    rows: list[Row] = []
    with (args.out / "gpu_check.log").open("a") as log:
        log.write(f"# gpu_check {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
        for i, name in enumerate(args.steps):
            cmd, limit = table[name]
            allotted = args.deadline.allot(name, limit, args.steps[i + 1 :])
            if allotted is None:
                results[name] = not_run(name, args.deadline, log)
                continue
            results[name] = run_step(name, cmd + args.deadline.options(name, allotted), allotted, log)
            rows += step_rows(name, results[name].lines)
        rows += nanogpt_ratios(rows)
        summary = "; ".join(f"{name} {r.verdict}" for name, r in results.items())
        total = sum(r.seconds for r in results.values())
        for line in ["", *table_lines(rows), "", f"== gpu_check: {summary} ({total:.0f} s in all)"]:
            say_and_log(log, line)
    steps = {
        name: {"passed": r.passed, "ran": r.ran, "seconds": round(r.seconds, 1)}
        for name, r in results.items()
    }
    machine = {"host": platform.node(), "python": platform.python_version(), "argv": sys.argv[1:]}
    write_json(args.out / "gpu_check.json", machine, steps, rows)
    return 0 if all(r.passed for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
