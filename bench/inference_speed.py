"""Decoding speed of an inference worker's model on each device it could use (issue 23): the same
randomly initialised preset, placed as worker.inference_device places it (float32 on the CPU,
bfloat16 on CUDA), generating `--tokens` tokens after a 16-token prompt, one request at a time,
with its KV cache. Prints tokens/s per device, CUDA's ratio to the CPU (goal >= 10x for
llama-110m) and, beside them, CUDA with graphed decoding off (trainer.model.decoders), with the
machine.

    .venv/bin/python bench/inference_speed.py --preset llama-110m --tokens 64
    .venv/bin/python bench/inference_speed.py --smoke          # llama-tiny, 8 tokens
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_rows import Row, emit
from trainer.config import model_config_from_preset
from trainer.model.llama import Llama
from trainer.sampling import generate_ids
from worker.inference_device import InferenceDevice


def tokens_per_s(model: Llama, tokens: int, rounds: int) -> float:
    prompt = list(range(1, 17))
    generate_ids(model, prompt, 4, temperature=0.8, seed=0)  # warm-up: kernels, allocator
    best = 0.0
    for r in range(rounds):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        new = generate_ids(model, prompt, tokens, temperature=0.8, seed=r, eos_id=None)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = max(best, len(new) / (time.perf_counter() - t0))
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-110m")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="the best of this many runs per device")
    ap.add_argument("--smoke", action="store_true", help="llama-tiny, 8 tokens, one round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.tokens, args.rounds = "llama-tiny", 8, 1
    torch.manual_seed(0)
    cpu_model = Llama(model_config_from_preset(args.preset))
    kinds = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    print(
        f"# inference_speed  {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch "
        f"threads, {gpu}, torch {torch.__version__}; {args.preset}, {args.tokens} tokens after 16, best of "
        f"{args.rounds}"
    )
    rates = {}
    # "cuda eager": graphed decoding off (FROMSCRATCH_CUDA_GRAPHS=0), what CUDA decoding was before
    for kind in [*kinds, *(["cuda eager"] if "cuda" in kinds else [])]:
        device = InferenceDevice(kind.split()[0])
        model = device.place(Llama(cpu_model.cfg))
        model.load_state_dict(cpu_model.state_dict())
        os.environ["FROMSCRATCH_CUDA_GRAPHS"] = "0" if kind == "cuda eager" else "1"
        rates[kind] = tokens_per_s(model, args.tokens, args.rounds)
        dtype = str(device.dtype).removeprefix("torch.")
        print(f"{kind:10s} {dtype:9s} {rates[kind]:10,.1f} tokens/s", flush=True)
        emit(Row("inference", f"{args.preset} decoding on {kind} ({dtype})", rates[kind], "tokens/s"))
    if "cuda" in rates:
        ratio = rates["cuda"] / rates["cpu"]
        print(f"cuda / cpu: {ratio:.1f}x (goal >= 10x: {'met' if ratio >= 10 else 'NOT met'})")
        emit(Row("inference", f"{args.preset} decoding cuda / cpu", ratio, "x", ">= 10", ratio >= 10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
