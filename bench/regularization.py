"""Best validation loss against dropout, over data sizes and model sizes (issue 21, item 3): the
measurements a data-aware `dropout: auto` rule is to be derived from.

    .venv/bin/python bench/regularization.py              # 3 data sizes x 2 models x 3 dropouts
    .venv/bin/python bench/regularization.py --smoke      # seconds: one tiny case
    .venv/bin/python bench/regularization.py --models 4x128 --sizes 200000 --seed 2 --max-steps 10000

Each case trains in this process (trainer.run.loop.train: fp32, eager, the CPU) on the first N
characters of tinyshakespeare (the last 10% held out), evaluating every --eval-every steps, and stops
early once --patience evaluations bring no new best. Printed per case: training tokens, parameters,
their ratio, the best validation loss with its step, and how much dropout improved on dropout 0.
Quality only: no timing is read from these runs, so a busy machine changes nothing but how long the
table takes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench._throughput_report import machine_description  # noqa: E402
from trainer.config import ModelConfig, TrainConfig  # noqa: E402
from trainer.run.loop import train  # noqa: E402

MODELS = {
    "2x64": dict(n_layer=2, n_head=4, n_embd=64, ctx=64),
    "4x128": dict(n_layer=4, n_head=4, n_embd=128, ctx=64),
}
DATA_CHARS = (50_000, 200_000, 1_000_000)
DROPOUTS = (0.0, 0.1, 0.2)


@dataclass(frozen=True)
class Case:
    model: str
    chars: int
    dropout: float


@dataclass(frozen=True)
class Outcome:
    train_tokens: int
    params: int
    best_val: float
    best_step: int
    steps: int


def default_corpus() -> Path:
    return REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


def run_case(case: Case, corpus: Path, work: Path, args: argparse.Namespace) -> Outcome:
    text = work / f"text-{case.chars}.txt"
    if not text.exists():
        text.write_text(corpus.read_text(encoding="utf-8")[: case.chars], encoding="utf-8")
    cfg = TrainConfig(
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        eval_every=args.eval_every,
        eval_batches=20,
        early_stopping_patience=args.patience,
        dropout=case.dropout,
        seed=args.seed,
        checkpoint_every=0,
        export_formats=[],
        device="cpu",
        dtype="float32",
        compile=False,
        log_every=args.eval_every,
    )
    out = work / f"{case.model}-{case.chars}-{case.dropout}"
    result = train(ModelConfig(**MODELS[case.model]), cfg, text, out)
    assert result.best_val_loss is not None and result.best_step is not None
    n_params = ModelConfig(**MODELS[case.model], vocab_size=258).num_params()
    return Outcome(int(case.chars * 0.9), n_params, result.best_val_loss, result.best_step, result.step)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=default_corpus(), help="tinyshakespeare.txt")
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--patience", type=int, default=4, help="evaluations without a new best before stopping")
    p.add_argument("--seed", type=int, default=1337, help="weights and data order")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument(
        "--sizes", default=",".join(map(str, DATA_CHARS)), help="characters of text, comma-separated"
    )
    p.add_argument("--dropouts", default=",".join(map(str, DROPOUTS)), help="comma-separated")
    p.add_argument("--smoke", action="store_true", help="one tiny case in seconds (the test suite runs it)")
    args = p.parse_args()
    models = args.models.split(",")
    if unknown := set(models) - set(MODELS):
        raise SystemExit(f"--models: unknown {sorted(unknown)}; choose from {', '.join(MODELS)}")
    sizes = tuple(int(n) for n in args.sizes.split(","))
    dropouts = tuple(float(d) for d in args.dropouts.split(","))
    if args.smoke:
        args.data = REPO / "tests" / "data" / "tiny_shakespeare_100k.txt"
        args.max_steps, args.eval_every, args.patience = 20, 10, 1
        models, sizes, dropouts = ["2x64"], (20_000,), (0.0, 0.2)
    print(
        f"# regularization  {time.strftime('%Y-%m-%d %H:%M')}  {machine_description(torch.device('cpu'))}"
        f"; seed {args.seed}, at most {args.max_steps} steps, patience {args.patience}"
    )
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fromscratch-regularization-") as tmp:
        for model in models:
            for chars in sizes:
                baseline: float | None = None
                for dropout in dropouts:
                    o = run_case(Case(model, chars, dropout), args.data, Path(tmp), args)
                    baseline = o.best_val if baseline is None else baseline
                    rows.append(
                        f"{model:<6} {o.train_tokens:>10,} {o.params:>9,} {o.train_tokens / o.params:>10.2f} "
                        f"{dropout:>7.1f} {o.best_val:>8.4f} {o.best_step:>9} {o.steps:>6} "
                        f"{baseline - o.best_val:>+10.4f}"
                    )
                    print(f"  done: {rows[-1]}", flush=True)
    header = "model   train tok    params  tok/param dropout best val best step  steps  vs drop 0"
    print(header)
    print("-" * len(header))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
