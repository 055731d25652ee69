"""Where an eager training step's time goes: torch.profiler over a few steps of a preset, its
kernels grouped by name, the costliest first (issue 23 found the eager step's element-wise kernels
costing as much as its matmuls this way). The step is the trainer's: float32 weights, bf16
autocast on CUDA, the loss through Llama.forward, backward, fused AdamW.

    python3 bench/profile_step.py --device cuda --preset llama-110m --ctx 1024 --batch-size 16
    python3 bench/profile_step.py --device cuda --loop --vocab 50304   # the trainer's own loop
    .venv/bin/python bench/profile_step.py --device cpu --smoke      # the script itself

--loop profiles steps of `trainer.run.loop.train` as bench/trainer_throughput.py times them (its
logging, metrics and syncs included, dropout off) and prints, beside the table, the wall time of a
step against the kernel time in it: a step that takes much longer than its kernels waits on the
host (launches, syncs). On CUDA a second table lists the host's time by self CPU time, where the
runtime calls that wait for the GPU (cudaStreamSynchronize, cudaMemcpy, cudaFree) show. On an
H100, llama-110m's first eager run ran 54 ms a step in the loop where the plain step's kernels
added up to 28 ms, and a later run of the same model 38 ms (bench/README.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_rows import Row, emit
from bench._timed_training import EnoughSteps, Variant, train_until_enough, variant_config
from bench.trainer_throughput import corpus_tokens
from trainer.config import ModelConfig, model_config_from_preset
from trainer.config.metrics import StepMetrics
from trainer.data.prepare import TokenData
from trainer.model.llama import Llama
from trainer.run.report import Callbacks

LOOP_WARMUP = 3  # logged steps before the profiled ones: the first times the Triton tiles


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument("--preset", default="llama-110m")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 untimed)")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument(
        "--vocab", default="258", help="vocabularies, comma-separated (258: bytes; 50304: nanoGPT's)"
    )
    ap.add_argument("--loop", action="store_true", help="profile the trainer's loop, not a plain step")
    ap.add_argument("--smoke", action="store_true", help="llama-tiny, ctx 64, batch 2, 2 steps (the script)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.ctx, args.batch_size, args.steps, args.rows = "llama-tiny", 64, 2, 2, 8
    for vocab in (int(v) for v in args.vocab.split(",")):
        profile_one(model_config_from_preset(args.preset, ctx=args.ctx, vocab_size=vocab), args)
    return 0


def profile_one(cfg: ModelConfig, args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    what = "the trainer's loop" if args.loop else "a plain step"
    print(
        f"# profile_step {args.preset} ctx {cfg.ctx} vocab {cfg.vocab_size} batch {args.batch_size} ", end=""
    )
    print(f"on {device}, {args.steps} steps of {what}")
    prof = profile_loop(cfg, args, device) if args.loop else profile_plain_step(cfg, args, device)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(f"kernels by total {'CUDA' if device.type == 'cuda' else 'CPU'} time")
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))
    if args.loop and device.type == "cuda":
        # where a step that outlasts its kernels spends the host's time: the CUDA runtime's calls
        # (a cudaStreamSynchronize, cudaMemcpy or cudaFree waits for the GPU) among the operators
        print("the host's time, by self CPU time (operators and CUDA runtime calls)")
        print(
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60)
        )


def profile_plain_step(cfg: ModelConfig, args: argparse.Namespace, device: torch.device) -> profile:
    """The step written out: float32 weights, autocast, the loss through Llama.forward, AdamW."""
    model = Llama(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x = torch.randint(0, cfg.vocab_size, (args.batch_size, cfg.ctx), device=device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            _, loss = model(x, x, argmax=True)  # as the trainer calls it: the loss may run fused
        assert loss is not None
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return prof


class LoopProfiler(Callbacks):
    """Profiles the logged steps after LOOP_WARMUP, `steps` of them, then ends the run."""

    def __init__(self, prof: profile, steps: int, device: torch.device):
        self.prof, self.steps, self.device = prof, steps, device
        self.seen, self.started, self.wall_s = 0, 0.0, 0.0

    def on_step(self, metrics: StepMetrics) -> None:
        # on CUDA a step is reported once the next one is queued (trainer.run.step_read): waiting
        # for the device at both ends puts `steps` whole steps in the window, reported late or not
        self.seen += 1
        if self.seen == LOOP_WARMUP:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.prof.start()
            self.started = time.perf_counter()
        elif self.seen == LOOP_WARMUP + self.steps:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.wall_s = time.perf_counter() - self.started
            self.prof.stop()
            raise EnoughSteps


def profile_loop(cfg: ModelConfig, args: argparse.Namespace, device: torch.device) -> profile:
    """Eager steps of trainer.run.loop.train, set up as trainer_throughput's timed runs; prints a
    step's wall time against the kernel time in it."""
    cuda = device.type == "cuda"
    train_cfg = variant_config(Variant(args.preset, cfg, args.batch_size, "bf16" if cuda else "fp32"), device)
    tokens = args.batch_size * (cfg.ctx + 1) * (LOOP_WARMUP + args.steps + 2)
    data = TokenData(train=corpus_tokens(max(tokens, 100_000)), val=None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities)
    profiler = LoopProfiler(prof, args.steps, device)
    train_until_enough(cfg, train_cfg, data, profiler)
    wall_ms = profiler.wall_s * 1e3 / args.steps
    events = prof.key_averages()
    kernel_ms = sum(getattr(e, "self_device_time_total", 0.0) for e in events) / 1e3 / args.steps
    host_ms = sum(e.self_cpu_time_total for e in events) / 1e3 / args.steps
    kernels = f"; kernels {kernel_ms:.1f} ms ({kernel_ms / wall_ms:.0%} of it)" if cuda else ""
    print(f"a step of the loop: wall {wall_ms:.1f} ms (profiled){kernels}; host ops {host_ms:.1f} ms")
    name = f"{args.preset} vocab {cfg.vocab_size} eager step of the loop"
    emit(Row("profile", f"{name}: wall", wall_ms, "ms"))
    if cuda:
        emit(Row("profile", f"{name}: kernels in it", kernel_ms, "ms"))
    return prof


if __name__ == "__main__":
    sys.exit(main())
