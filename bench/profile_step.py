"""Where an eager training step's time goes: torch.profiler over a few steps of a preset, its
kernels grouped by name, the costliest first (issue 23 found the eager step's element-wise kernels
costing as much as its matmuls this way). The step is the trainer's: float32 weights, bf16
autocast on CUDA, the loss through Llama.forward, backward, fused AdamW.

    python3 bench/profile_step.py --device cuda --preset llama-110m --ctx 1024 --batch-size 16
    .venv/bin/python bench/profile_step.py --device cpu --smoke      # the script itself
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.config import model_config_from_preset
from trainer.model.llama import Llama


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
    ap.add_argument("--smoke", action="store_true", help="llama-tiny, ctx 64, batch 2, 2 steps (the script)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.ctx, args.batch_size, args.steps, args.rows = "llama-tiny", 64, 2, 2, 8
    device = torch.device(args.device)
    cfg = model_config_from_preset(args.preset, ctx=args.ctx, vocab_size=258)
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
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(
        f"# profile_step {args.preset} ctx {cfg.ctx} batch {args.batch_size} on {device}, {args.steps} steps"
    )
    print(f"kernels by total {'CUDA' if device.type == 'cuda' else 'CPU'} time")
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
