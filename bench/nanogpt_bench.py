"""nanoGPT's own `bench.py` (GPT-2 124M, ctx 1024, bf16, synthetic tokens), eager and compiled, for
bench/gpu_check.py's `nanogpt` step: its FLOP rate beside ours (the `throughput` step's llama-110m
at the same context), which gpu_check divides (issue 23: >= 1.0x eager, >= 1.1x compiled).

nanoGPT prints "time per iteration: X ms, MFU: Y%" against an A100's 312 TFLOP/s, so its FLOP rate
is Y% x 312 TFLOP/s whatever GPU it ran on (its FLOPs per token: 6N + 12 L T d, as ours).

    python3 bench/nanogpt_bench.py --nanogpt PATH [--batch-size 16]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_rows import Row, emit

NANOGPT_PROMISED = 312e12  # model.py's estimate_mfu divides by an A100's bf16 peak
_RESULT = re.compile(r"time per iteration: ([\d.]+)ms, MFU: ([\d.]+)%")


def flop_rate(output: str) -> tuple[float, float] | None:
    """(ms per iteration, FLOP/s) from bench.py's output; None when it printed no result."""
    found = _RESULT.findall(output)
    if not found:
        return None
    ms, mfu = (float(x) for x in found[-1])
    return ms, mfu / 100 * NANOGPT_PROMISED


def run(nanogpt: Path, compile_: bool, batch_size: int, timeout: float) -> str:
    cmd = [
        sys.executable,
        "bench.py",
        "--real_data=False",
        f"--compile={compile_}",
        f"--batch_size={batch_size}",
    ]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=nanogpt, capture_output=True, text=True, timeout=timeout)
    print(proc.stdout[-2000:], proc.stderr[-2000:] if proc.returncode else "", sep="\n", flush=True)
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout (its bench.py)")
    ap.add_argument("--batch-size", type=int, default=16, help="as the throughput step's llama-110m")
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds each run may take")
    args = ap.parse_args(argv)
    if not (args.nanogpt / "bench.py").exists():
        ap.error(f"--nanogpt: no bench.py in {args.nanogpt}")
    failed = False
    for compile_ in (False, True):
        result = flop_rate(run(args.nanogpt, compile_, args.batch_size, args.timeout))
        label = f"nanoGPT 124M bf16 {'compiled' if compile_ else 'eager'}"
        if result is None:
            emit(Row("nanogpt", f"{label} TFLOP/s", "no result", met=False))
            failed = True
            continue
        ms, rate = result
        tokens = args.batch_size * 1024 / (ms / 1000)
        emit(Row("nanogpt", f"{label} tokens/s", tokens, "tokens/s"))
        emit(Row("nanogpt", f"{label} TFLOP/s", rate / 1e12, "TFLOP/s"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
