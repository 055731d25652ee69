"""The quality recipes of bench/peer.py: nanoGPT and fromscratch trained at the same size on the same
text, side by side in one run, each program's validation curve read with the time since its start.

(`readme-cpu`, nanoGPT's README CPU recipe, is peer.py's own `time_to_quality`.)
- `overfit`: where overfitting decides the outcome: nanoGPT's README CPU model (4 layers, 4 heads,
  128 wide, ctx 64, batch 12; 0.8M parameters) on the first 200 KB of tinyshakespeare (0.2 training
  tokens per parameter), 3000 iterations, nanoGPT with the dropout 0.2 of its shakespeare_char config. Figures: each program's *best*
  validation loss, and the time our loss takes to reach nanoGPT's best over nanoGPT's time to reach it.
- `shakespeare-gpu`: nanoGPT's config/train_shakespeare_char.py as it is (6 layers, 6 heads, 384 wide,
  ctx 256, batch 64, dropout 0.2, 5000 iterations, evaluating every 250 on 200 batches) and ours at the
  same size; the same figures as `overfit`. Meant for `--device cuda`; it runs on the CPU too.

Our side takes our defaults beyond the size and the evaluation cadence, plus peer.py's `--ours`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

EVAL_LINE = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


@dataclass(frozen=True)
class Recipe:
    shape: dict[str, int]  # n_layer, n_head, n_embd, ctx, batch
    iters: int
    eval_every: int
    eval_batches: int
    target: Literal["final", "best"]  # the nanoGPT loss ours must reach
    corpus_chars: int | None = None  # the first N characters of the corpus (None: all)
    stop_at: int | None = None  # cut both runs here; nanoGPT's schedule stays `iters` long
    nanogpt: dict[str, object] = field(default_factory=dict)  # its settings beyond shape and cadence


RECIPES: dict[str, Recipe] = {
    "overfit": Recipe(
        dict(n_layer=4, n_head=4, n_embd=128, ctx=64, batch=12),
        3000,
        100,
        20,
        "best",
        corpus_chars=200_000,
        nanogpt={"dropout": 0.2},
    ),
    "shakespeare-gpu": Recipe(
        dict(n_layer=6, n_head=6, n_embd=384, ctx=256, batch=64),
        5000,
        250,
        200,
        "best",
        nanogpt={"dropout": 0.2},
    ),
}


@dataclass(frozen=True)
class Evaluation:
    step: int
    val_loss: float
    seconds: float  # since the program started, when the evaluation was done


@dataclass(frozen=True)
class Curve:
    evaluations: list[Evaluation]
    wall: float

    @property
    def best(self) -> Evaluation:
        return min(self.evaluations, key=lambda e: e.val_loss)

    @property
    def last(self) -> Evaluation:
        return self.evaluations[-1]

    def first_reaching(self, loss: float) -> Evaluation | None:
        return next((e for e in self.evaluations if e.val_loss <= loss), None)


def corpus_slice(corpus: Path, chars: int | None, into: Path) -> Path:
    """The recipe's text as a file both programs read."""
    if chars is None:
        return corpus
    path = into / f"corpus-{chars}.txt"
    path.write_text(corpus.read_text(encoding="utf-8")[:chars], encoding="utf-8")
    return path


def nanogpt_args(recipe: Recipe, device: str) -> list[str]:
    """nanoGPT's config/train_shakespeare_char.py with the recipe's size and cadence; fp32 and eager
    on the CPU (as our side), its own bf16 and torch.compile on CUDA."""
    s = recipe.shape
    settings: dict[str, object] = {
        "n_layer": s["n_layer"],
        "n_head": s["n_head"],
        "n_embd": s["n_embd"],
        "block_size": s["ctx"],
        "batch_size": s["batch"],
        "max_iters": recipe.stop_at or recipe.iters,
        "lr_decay_iters": recipe.iters,
        "eval_interval": recipe.eval_every,
        "eval_iters": recipe.eval_batches,
        "log_interval": 100,
        "device": device,
        **({"compile": False, "dtype": "float32"} if device == "cpu" else {}),
        **recipe.nanogpt,
    }
    return [f"--{k}={v}" for k, v in settings.items()]


def our_args(recipe: Recipe, device: str) -> list[str]:
    s = recipe.shape
    return [
        *("--n-layer", str(s["n_layer"]), "--n-head", str(s["n_head"])),
        *("--n-embd", str(s["n_embd"]), "--ctx", str(s["ctx"]), "--batch-size", str(s["batch"])),
        *("--max-steps", str(recipe.stop_at or recipe.iters), "--eval-every", str(recipe.eval_every)),
        *("--eval-batches", str(recipe.eval_batches), "--val-fraction", "0.1"),
        *("--export-formats", "none", "--samples", "0", "--device", device),
    ]


def streamed_run(
    name: str, cmd: list[str], cwd: Path, env: dict[str, str]
) -> tuple[list[tuple[float, str]], float]:
    """(each stdout line with the seconds since start when it came, wall seconds) of a program that
    must succeed; progress lines are echoed so a long run shows it is alive."""
    started = time.perf_counter()
    lines: list[tuple[float, str]] = []
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        lines.append((time.perf_counter() - started, line.rstrip("\n")))
        if EVAL_LINE.match(line) or line.startswith("eval step "):  # nanoGPT's, ours
            print(f"  {name}: {line.strip()}", flush=True)
    stderr = proc.stderr.read()
    if proc.wait() != 0:
        raise SystemExit(f"{name} failed:\n{stderr[-3000:]}")
    return lines, time.perf_counter() - started


def nanogpt_curve(nanogpt: Path, workdir: Path, recipe: Recipe, device: str, env: dict[str, str]) -> Curve:
    config = nanogpt / "config" / "train_shakespeare_char.py"
    out = workdir / "out"
    cmd = [
        sys.executable,
        str(nanogpt / "train.py"),
        str(config),
        *nanogpt_args(recipe, device),
        f"--out_dir={out}",
    ]
    lines, wall = streamed_run("nanoGPT", cmd, workdir, env)
    evaluations = [
        Evaluation(int(m.group(1)), float(m.group(3)), t) for t, line in lines if (m := EVAL_LINE.match(line))
    ]
    return Curve(evaluations, wall)


def our_curve(corpus: Path, out: Path, args: list[str], repo: Path, env: dict[str, str]) -> Curve:
    import json

    cmd = [sys.executable, "-m", "cli.main", "train", str(corpus), "--out", str(out), *args]
    started = time.time()
    _, wall = streamed_run("fromscratch", cmd, repo, env)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluations = [
        Evaluation(r["step"], r["val_loss"], r["time"] - started) for r in records if "val_loss" in r
    ]
    return Curve(evaluations, wall)


def describe(name: str, curve: Curve) -> None:
    best, last = curve.best, curve.last
    print(
        f"{name}: {curve.wall:.1f} s in all; best val loss {best.val_loss:.4f} at step {best.step} "
        f"({best.seconds:.1f} s), last {last.val_loss:.4f} at step {last.step}"
    )


def report(recipe_name: str, recipe: Recipe, nano: Curve, ours: Curve, ours_extra: list[str]) -> None:
    """Our run's best (and last) validation loss with when, then its time-to-quality ratio against
    nanoGPT's curve (described once, before)."""
    describe(f"fromscratch ({' '.join(ours_extra) or 'defaults'})", ours)
    target = nano.best if recipe.target == "best" else nano.last
    target_seconds = target.seconds if recipe.target == "best" else nano.wall
    reached = ours.first_reaching(target.val_loss)
    if reached is None:
        print(f"  did not reach nanoGPT's {recipe.target} validation loss {target.val_loss:.4f}")
        return
    print(
        f"  reached val {reached.val_loss:.4f} <= {target.val_loss:.4f} at step {reached.step}, "
        f"{reached.seconds:.1f} s after its start: time to quality {reached.seconds / target_seconds:.2f}x "
        f"nanoGPT's ({recipe_name})"
    )


def run_recipe(
    name: str,
    nanogpt: Path,
    workdir: Path,
    corpus: Path,
    device: str,
    env: dict[str, str],
    variants: list[list[str]],
    stop_at: int | None = None,
) -> None:
    """nanoGPT on the recipe, then ours once per variant (extra options; `stop_at`: fewer steps),
    each reported against nanoGPT's curve."""
    from bench.peer import REPO, nanogpt_workdir

    recipe = replace(RECIPES[name], stop_at=stop_at)
    text = corpus_slice(corpus, recipe.corpus_chars, workdir)
    nano_dir = nanogpt_workdir(nanogpt, text, workdir / f"nanogpt-{name}")
    print(
        f"recipe {name}: {recipe.shape}, {recipe.stop_at or recipe.iters} of its {recipe.iters} steps, "
        f"{text.stat().st_size:,} bytes of text, {device}"
    )
    nano = nanogpt_curve(nanogpt, nano_dir, recipe, device, env)
    describe("nanoGPT", nano)
    for i, extra in enumerate(variants):
        ours = our_curve(text, workdir / f"ours-{name}-{i}", our_args(recipe, device) + extra, REPO, env)
        report(name, recipe, nano, ours, extra)


def gpu_env(env: dict[str, str], device: str) -> dict[str, str]:
    """On CUDA neither program is held to the CPU's thread count."""
    if device == "cpu":
        return env
    return {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")} | {
        "PATH": os.environ.get("PATH", "")
    }
