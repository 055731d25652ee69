"""How close each fused Triton kernel of the eager CUDA step comes to the card's memory bandwidth,
and which tile the step's timing picked: RMSNorm, the q/k/v split with RoPE and SwiGLU, forward and
backward, and the cross-entropy of one chunk of the fused loss (at nanoGPT's vocabulary by default),
at a preset's training shape, beside their torch-op form and a plain device copy measured
in the same run (the copy's GB/s is the bandwidth these element-wise kernels can hope for).

    python3 bench/kernel_speed.py                        # on a GPU: llama-110m, ctx 1024, batch 16
    .venv/bin/python bench/kernel_speed.py --smoke       # the script, here (Triton's interpreter)

On a GPU each time is the kernels' own: the calls are replayed as one CUDA graph (timed one by
one, the small kernels' times were their host's, on 2026-11-27's H100 box; bench/README.md).
The GB/s of a kernel counts the bytes it must read and write once (its inputs and outputs), so
"% of copy" is how much of the copy's bandwidth it reaches. Each kernel's outputs are also compared
with the torch-op form's at this shape (the tests check them at small ones). For the tiled kernels
(RMSNorm both ways, the q/k/v split, the cross-entropy) it also prints every candidate tile's time, as
trainer.model.kernel_tiles measured them on the first training launch, and the default tile (what
runs untimed). Last, causal attention forward and backward through each of torch's SDPA backends
(flash, cuDNN, memory-efficient) at llama-110m's and the 1.2B config's shapes
(bench/_attention_cases.py): which one the model's attention should prefer on this GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MAX_DIFFERENCE = 2e-2  # bf16 storage: both forms compute in float32 and round once


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-110m")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument(
        "--vocab", type=int, default=50304, help="the cross-entropy's (nanoGPT's GPT-2 vocabulary)"
    )
    ap.add_argument("--reps", type=int, default=20, help="timed launches per figure (median)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, in Triton's interpreter")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:  # before Triton loads: the kernels run on CPU tensors in its interpreter
        os.environ["TRITON_INTERPRET"] = "1"
        args.preset, args.ctx, args.batch_size, args.reps, args.vocab = "llama-tiny", 16, 2, 2, 300
    import torch

    from bench._gpu_rows import Row, emit
    from trainer.config import model_config_from_preset
    from trainer.model import triton_kernels

    if triton_kernels.triton is None:
        print("Triton is not installed: pip install triton (the gpu extra)")
        return 1
    device = torch.device("cpu" if args.smoke else "cuda")
    cfg = model_config_from_preset(args.preset, ctx=args.ctx, vocab_size=258)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "no GPU (interpreter)"
    print(
        f"# kernel_speed  {platform.machine()}, {gpu}, torch {torch.__version__}, Triton "
        f"{triton_kernels.triton.__version__}; {args.preset} ctx {args.ctx} batch {args.batch_size}, "
        f"vocab {args.vocab}, bf16, "
        + (
            f"{args.reps} calls replayed as a CUDA graph"
            if device.type == "cuda"
            else f"median of {args.reps}"
        )
    )
    timer = Timer(device, args.reps)
    copy_gbs = timer.copy_gb_per_s(args.batch_size * args.ctx * cfg.n_embd)
    print(f"device copy: {copy_gbs:,.0f} GB/s")
    emit(Row("kernels", "device copy bandwidth", copy_gbs, "GB/s"))
    header = f"{'kernel':28s} {'Triton us':>10s} {'GB/s':>8s} {'% copy':>7s} {'torch ops us':>13s}"
    header += f" {'x torch':>8s} {'rel diff':>9s}"
    print(header)
    print("-" * len(header))
    from bench._kernel_cases import cases, relative_difference

    worst = 0.0
    for case in cases(cfg, args.batch_size, args.vocab, device):
        ours, theirs = timer.seconds(case.triton), timer.seconds(case.torch_ops)
        difference = relative_difference(case.triton(), case.torch_ops())
        worst = max(worst, difference)
        gbs = case.bytes / ours / 1e9
        print(
            f"{case.name:28s} {ours * 1e6:10,.1f} {gbs:8,.0f} {100 * gbs / copy_gbs:6.1f}% "
            f"{theirs * 1e6:13,.1f} {theirs / ours:7.2f}x {difference:9.1e}"
        )
        emit(Row("kernels", f"{case.name}: Triton's share of copy bandwidth", 100 * gbs / copy_gbs, "%"))
        emit(Row("kernels", f"{case.name}: Triton / torch ops speed", theirs / ours, "x"))
    ok = worst <= MAX_DIFFERENCE
    print(f"largest difference from torch ops, relative to their largest value: {worst:.1e}")
    item = "Triton vs torch ops: largest relative difference"
    emit(Row("kernels", item, worst, goal=f"<= {MAX_DIFFERENCE}", met=ok))
    print_tiles()
    from bench._attention_cases import compare_backends

    compare_backends(timer.seconds, device, args.smoke)
    return 0 if ok else 1


def print_tiles() -> None:
    """Each tiled kernel's candidates as timed on their first training launch (none: not timed)."""
    from trainer.model import triton_ops

    tables = (triton_ops.RMS_FORWARD_TILES, triton_ops.RMS_BACKWARD_TILES, triton_ops.ROPE_TILES)
    for table in (*tables, triton_ops.CROSS_ENTROPY_TILES):
        if not table.times:
            print(f"{table.name}: tiles not timed (interpreter, or launches below the threshold)")
        for key, times in table.times.items():
            shown = ", ".join(f"{tile}: {s * 1e6:,.1f} us" for tile, s in times.items())
            print(f"{table.name} {key[:2]}: chose {table.chosen[key]} (default {table.default}); {shown}")


class Timer:
    """Seconds per call. On a GPU the kernels' time: `reps` calls replayed as one CUDA graph
    between two events (trainer.model.kernel_tiles.cuda_seconds), their mean; the calls timed one
    by one measured the host's time for the small kernels. On the CPU the median wall clock."""

    def __init__(self, device: torch.device, reps: int):
        self.device, self.reps = device, reps

    def seconds(self, fn: Callable[[], object]) -> float:
        from trainer.model.kernel_tiles import cuda_seconds

        fn()  # compiles, and times the tiles of a training launch
        if self.device.type == "cuda":
            return cuda_seconds(fn, self.reps)
        return statistics.median(wall_seconds(fn) for _ in range(self.reps))

    def copy_gb_per_s(self, elements: int) -> float:
        """A float32 device-to-device copy of `elements` values: bytes read and written per second."""
        import torch

        src = torch.randn(elements, device=self.device)
        dst = torch.empty_like(src)
        return 2 * src.numel() * 4 / self.seconds(lambda: dst.copy_(src)) / 1e9


def wall_seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
