"""fromscratch side by side with nanoGPT, on this machine, in one run (issue 13).

    git clone https://github.com/karpathy/nanoGPT /somewhere/outside/the/repo
    .venv/bin/python bench/peer.py --nanogpt /somewhere/outside/the/repo/nanoGPT
    .venv/bin/python bench/peer.py --nanogpt PATH --speed-only --rounds 5
    .venv/bin/python bench/peer.py --nanogpt PATH --speed-only --clock cpu   # 1 thread, CPU time
    .venv/bin/python bench/peer.py --nanogpt PATH --rounds 0 --recipe overfit
    .venv/bin/python bench/peer.py --nanogpt PATH --rounds 0 --recipe shakespeare-gpu --device cuda

Both programs run as they are (their own `train.py` and our `fromscratch train`), as subprocesses,
on the same corpus (tinyshakespeare; nanoGPT's character ids, our byte tokenizer), fp32, eager, with
the same number of threads. Two figures, each a ratio taken in this run:

1. **Step speed at nanoGPT's shape** (4 layers, 4 heads, 256 wide, ctx 128, batch 16, dropout 0): the
   median steady-state time per step of each (steps 5 on; nanoGPT's own `time ...ms` lines, our
   metrics.jsonl timestamps), rounds interleaved (nanoGPT, ours, nanoGPT, ours ...); printed as
   our tokens/s / nanoGPT's, per round and their median. With `--clock cpu` both run on 1 thread
   and a step's cost is CPU time: each program runs twice, `--steps` and 4x that many steps, and
   the difference of the two runs' CPU time (the OS's count for the child process) divided by the
   difference of their step counts is its time per step, start-up and evaluation cancelling out.
   On a shared VM wall-clock rounds swing by 20% as neighbours come and go; CPU time of one
   thread does not count the time the OS gave to others.
2. **Time to quality** on nanoGPT's README CPU recipe (4 layers, 4 heads, 128 wide, ctx 64,
   2000 iterations of 12 sequences, dropout 0): nanoGPT's wall time and final validation loss,
   then the wall time from our process's start until our validation loss (same model size, same
   validation split: the last 10% of the text) first reaches that loss, with our defaults for the
   rest. Printed as our time / nanoGPT's. `--recipe overfit` and `--recipe shakespeare-gpu` instead
   train where overfitting decides and compare best validation losses (bench/_peer_recipes.py).

nanoGPT is never imported or committed: it runs from the path given, in a scratch folder that
holds the data in its format (train.bin/val.bin of uint16 character ids, meta.pkl).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._peer_recipes import RECIPES, gpu_env, run_recipe  # noqa: E402
from bench._throughput_report import machine_description  # noqa: E402

SPEED_SHAPE = dict(n_layer=4, n_head=4, n_embd=256, ctx=128, batch=16)
RECIPE = dict(n_layer=4, n_head=4, n_embd=128, ctx=64, batch=12, iters=2000)
ITER_LINE = re.compile(r"^iter (\d+): loss [\d.naninf]+, time ([\d.]+)ms", re.M)
EVAL_LINE = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", re.M)


def default_corpus() -> Path:
    return REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


# ------------------------------------------------------------------------------------ nanoGPT
def nanogpt_workdir(nanogpt: Path, corpus: Path, into: Path) -> Path:
    """A folder nanoGPT's train.py runs in: its configurator.py and data/shakespeare_char as its
    prepare.py writes it (first 90% train, last 10% val, sorted characters as ids)."""
    text = corpus.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(len(ids) * 0.9)
    data = into / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    ids[:n].tofile(data / "train.bin")
    ids[n:].tofile(data / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))  # nanoGPT's own format, read by nanoGPT
    shutil.copy(nanogpt / "configurator.py", into / "configurator.py")
    return into


def run_nanogpt(nanogpt: Path, workdir: Path, args: list[str], env: dict[str, str]) -> tuple[str, float]:
    """(stdout, wall seconds) of nanoGPT's train.py with `args`."""
    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    stdout, wall, _ = timed_run(
        "nanoGPT", [sys.executable, str(nanogpt / "train.py"), *args, f"--out_dir={out}"], workdir, env
    )
    return stdout, wall


def timed_run(name: str, cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, float, float]:
    """(stdout, wall seconds, start as time.time()) of a program that must succeed."""
    started = time.time()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{name} failed:\n{r.stderr[-3000:]}")
    return r.stdout, wall, started


def children_cpu_seconds() -> float:
    """User + system CPU time of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def nanogpt_shape_args(shape: dict[str, int], **extra: object) -> list[str]:
    base: dict[str, object] = {
        "dataset": "shakespeare_char",
        "device": "cpu",
        "compile": False,
        "dtype": "float32",
        "n_layer": shape["n_layer"],
        "n_head": shape["n_head"],
        "n_embd": shape["n_embd"],
        "block_size": shape["ctx"],
        "batch_size": shape["batch"],
        "gradient_accumulation_steps": 1,
        "dropout": 0.0,
        "log_interval": 1,
        "always_save_checkpoint": False,
        **extra,
    }
    return [f"--{k}={v}" for k, v in base.items()]


# ------------------------------------------------------------------------------------ fromscratch
def run_ours(
    corpus: Path, out: Path, args: list[str], env: dict[str, str]
) -> tuple[list[dict], float, float]:
    """(metrics.jsonl records, wall seconds, start time as time.time()) of `fromscratch train`."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "cli.main", "train", str(corpus), "--out", str(out), *args]
    _, wall, started = timed_run("fromscratch", cmd, REPO, env)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records, wall, started


def our_shape_args(shape: dict[str, int], steps: int) -> list[str]:
    return [
        *("--n-layer", str(shape["n_layer"]), "--n-head", str(shape["n_head"])),
        *("--n-embd", str(shape["n_embd"]), "--ctx", str(shape["ctx"])),
        *("--batch-size", str(shape["batch"]), "--max-steps", str(steps)),
        *("--eval-every", "0", "--checkpoint-every", "0", "--export-formats", "none", "--samples", "0"),
        *("--device", "cpu", "--dtype", "float32", "--no-compile", "--log-every", "1"),
        # nanoGPT's dropout (0.0 in nanogpt_shape_args): our default, auto, picks 0.1 for this corpus and
        # model, and on the CPU attention dropout takes SDPA off its flash kernel (~1.35x the step)
        *("--dropout", "0"),
    ]


# ------------------------------------------------------------------------------------ figures
def logged_step_seconds(records: list[dict]) -> list[float]:
    """Seconds between consecutive logged training steps of `fromscratch train`'s metrics.jsonl."""
    stamps = [r["time"] for r in records if "train_loss" in r]
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def steady_step_seconds(times: list[float]) -> float:
    """Median of the per-step times from step 5 on (the first steps warm allocators and caches)."""
    return statistics.median(times[5:])


@dataclass
class SpeedRound:
    nano_tps: float
    ours_tps: float

    @property
    def ratio(self) -> float:
        return self.ours_tps / self.nano_tps


def cpu_speed_round(
    nanogpt: Path, workdir: Path, corpus: Path, steps: int, env: dict[str, str]
) -> SpeedRound:
    """tokens per CPU-second of each program: (CPU time of a 4*steps run - that of a steps run) per
    extra step, so start-up and the one-off work of a run cancel out."""
    shape = SPEED_SHAPE
    tokens = shape["batch"] * shape["ctx"]

    def nano(n: int) -> None:
        run_nanogpt(
            nanogpt, workdir, nanogpt_shape_args(shape, max_iters=n, eval_interval=10**6, eval_iters=1), env
        )

    def ours(n: int) -> None:
        run_ours(corpus, workdir / "ours-speed", our_shape_args(shape, n), env)

    per_step = {}
    for name, program in (("nano", nano), ("ours", ours)):
        cost = []
        for n in (steps, 4 * steps):
            before = children_cpu_seconds()
            program(n)
            cost.append(children_cpu_seconds() - before)
        per_step[name] = (cost[1] - cost[0]) / (3 * steps)
    return SpeedRound(tokens / per_step["nano"], tokens / per_step["ours"])


def speed_round(nanogpt: Path, workdir: Path, corpus: Path, steps: int, env: dict[str, str]) -> SpeedRound:
    shape = SPEED_SHAPE
    tokens = shape["batch"] * shape["ctx"]
    stdout, _ = run_nanogpt(
        nanogpt, workdir, nanogpt_shape_args(shape, max_iters=steps, eval_interval=10**6, eval_iters=1), env
    )
    nano_dt = [float(ms) / 1000 for it, ms in ITER_LINE.findall(stdout) if int(it) > 0]
    records, _, _ = run_ours(corpus, workdir / "ours-speed", our_shape_args(shape, steps), env)
    ours_dt = logged_step_seconds(records)
    return SpeedRound(tokens / steady_step_seconds(nano_dt), tokens / steady_step_seconds(ours_dt))


def time_to_quality(
    nanogpt: Path, workdir: Path, corpus: Path, env: dict[str, str], variants: list[list[str]]
) -> None:
    """nanoGPT's README CPU recipe once, then ours once per variant (extra options), each timed to
    nanoGPT's final validation loss."""
    r = RECIPE
    config = nanogpt / "config" / "train_shakespeare_char.py"
    nano_args = [str(config)] + nanogpt_shape_args(
        r,
        eval_iters=20,
        max_iters=r["iters"],
        lr_decay_iters=r["iters"],
    )
    stdout, nano_wall = run_nanogpt(nanogpt, workdir, nano_args, env)
    evals = EVAL_LINE.findall(stdout)
    target = float(evals[-1][2])
    print(f"nanoGPT recipe: {nano_wall:.1f} s, final val loss {target:.4f} ({len(evals)} evaluations)")
    for i, extra in enumerate(variants):
        ours_to_target(corpus, workdir / f"ours-quality-{i}", env, extra, target, nano_wall)


def ours_to_target(
    corpus: Path, out: Path, env: dict[str, str], ours_extra: list[str], target: float, nano_wall: float
) -> None:
    r = RECIPE
    ours_args = [
        *("--n-layer", str(r["n_layer"]), "--n-head", str(r["n_head"])),
        *("--n-embd", str(r["n_embd"]), "--ctx", str(r["ctx"])),
        *("--export-formats", "none", "--samples", "0", "--device", "cpu", "--val-fraction", "0.1"),
        *ours_extra,
    ]
    records, ours_wall, started = run_ours(corpus, out, ours_args, env)
    evals_ours = [
        (rec["step"], rec["val_loss"], rec["time"] - started) for rec in records if "val_loss" in rec
    ]
    reached = next(((s, v, t) for s, v, t in evals_ours if v <= target), None)
    final = evals_ours[-1] if evals_ours else None
    print(f"fromscratch ({' '.join(ours_extra) or 'defaults'}): {ours_wall:.1f} s in all", end="")
    if final:
        print(f", last val loss {final[1]:.4f} at step {final[0]}", end="")
    print()
    if reached is None:
        print("fromscratch did not reach nanoGPT's final validation loss")
        return
    step, val, t = reached
    print(
        f"fromscratch reached val {val:.4f} <= {target:.4f} at step {step}, {t:.1f} s after its start: "
        f"time to quality {t / nano_wall:.2f}x nanoGPT's"
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout (outside this repo)")
    p.add_argument("--data", type=Path, default=default_corpus(), help="tinyshakespeare.txt")
    p.add_argument("--rounds", type=int, default=3, help="interleaved speed rounds (0: none)")
    p.add_argument("--steps", type=int, default=40, help="steps per speed run")
    p.add_argument("--threads", type=int, default=2, help="threads of both programs")
    p.add_argument("--speed-only", action="store_true", help="skip the time-to-quality runs")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="speed rounds: wall clock at --threads, or CPU time at 1 thread (steady on a shared machine)",
    )
    p.add_argument(
        "--ours",
        action="append",
        default=None,
        help="extra `fromscratch train` options for the quality run; overfit/shakespeare-gpu take it "
        "again for more runs of ours against the one nanoGPT run",
    )
    p.add_argument(
        "--recipe",
        choices=("readme-cpu", *RECIPES),
        default="readme-cpu",
        help="the quality run: nanoGPT's README CPU recipe (time to its final loss), or one where "
        "overfitting decides (time to its best loss; bench/_peer_recipes.py)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="the quality run's device")
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="overfit/shakespeare-gpu: stop both programs after this many steps (nanoGPT keeps its "
        "recipe's schedule, so its curve is the full run's up to there; ours schedules over these)",
    )
    return p.parse_args()


def main() -> None:
    args = parse_args()
    args.nanogpt = args.nanogpt.resolve()  # nanoGPT runs from scratch folders elsewhere
    if not (args.nanogpt / "train.py").exists():
        raise SystemExit(f"{args.nanogpt} is not a nanoGPT checkout (no train.py)")
    if args.clock == "cpu":
        args.threads = 1
    variants = [extra.split() for extra in args.ours or [""]]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}

    import torch

    torch.set_num_threads(args.threads)
    print(f"# peer  {time.strftime('%Y-%m-%d %H:%M')}  {machine_description(torch.device('cpu'))}")
    with tempfile.TemporaryDirectory(prefix="fromscratch-peer-") as tmp:
        workdir = nanogpt_workdir(args.nanogpt, args.data, Path(tmp))
        speed_rounds(args, workdir, env)
        if args.speed_only:
            return
        if args.recipe == "readme-cpu":
            time_to_quality(args.nanogpt, workdir, args.data, env, variants)
        else:
            quality_env = gpu_env(env, args.device)
            run_recipe(
                args.recipe,
                args.nanogpt,
                Path(tmp),
                args.data,
                args.device,
                quality_env,
                variants,
                args.iters,
            )


def speed_rounds(args: argparse.Namespace, workdir: Path, env: dict[str, str]) -> None:
    """--rounds interleaved speed rounds at nanoGPT's shape, and their median ratio."""
    rounds = []
    measure = cpu_speed_round if args.clock == "cpu" else speed_round
    unit = "tok per CPU-second" if args.clock == "cpu" else "tok/s"
    for i in range(args.rounds):
        rnd = measure(args.nanogpt, workdir, args.data, args.steps, env)
        rounds.append(rnd)
        print(
            f"speed round {i + 1}: nanoGPT {rnd.nano_tps:,.0f} {unit}, fromscratch {rnd.ours_tps:,.0f} {unit} "
            f"= {rnd.ratio:.2f}x"
        )
    if rounds:
        median = statistics.median(r.ratio for r in rounds)
        clock = "1 thread, CPU time" if args.clock == "cpu" else f"{args.threads} threads, wall clock"
        print(f"step speed at nanoGPT's shape (fp32, eager, {clock}): {median:.2f}x")


if __name__ == "__main__":
    main()
