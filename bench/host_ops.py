"""What the host does in one eager CUDA training step, counted on any machine: the aten operations
(each one a trip through the dispatcher, most of them a kernel launch on a GPU) and the Triton
launches of a bf16 step of the CUDA path, with nanoGPT's model beside it when given its path.

On an H100, llama-110m's eager step waited on its host: 28 ms of kernels in a 54 ms step
(bench/README.md). Its host time goes to these operations and launches, so fewer of them is a
faster eager step there; the counts do not depend on the machine, and are measured here without a
GPU: the model runs the CUDA path on tiny CPU tensors with the Triton launches stubbed out (each
counted, none run), under bf16 autocast, the loss fused with the output projection as on CUDA.

    .venv/bin/python bench/host_ops.py --nanogpt PATH        # llama-110m's shape, and nanoGPT's
    .venv/bin/python bench/host_ops.py --nanogpt PATH --time 7   # and the host's time a step
    .venv/bin/python bench/host_ops.py --smoke               # the script itself

`--time ROUNDS` also times the host's work: thread CPU time of a step (1 thread), ours and
nanoGPT's in turn, ROUNDS rounds, medians. The models keep their layers and heads but are 8 values
a head wide, so the step's operations are the same and their CPU arithmetic small: what is left is
the dispatcher, the autograd engine and the Python around them (a GPU adds each launch's cost,
and Triton's launcher on top, which the stubs here leave out).

One difference from a CUDA step remains: torch's CPU flash attention writes its output heads-first,
so the attention output is copied into token rows (an empty and a copy_ a layer) where CUDA's
flash kernels write token rows and the model takes a view (trainer.model.llama._token_rows).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.config import ModelConfig, model_config_from_preset
from trainer.config.fused_loss import ENV as FUSED_LOSS_ENV
from trainer.model import fused_ops, linear_cross_entropy, llama, triton_kernels, triton_ops
from trainer.model.kernel_tiles import TileTable

Step = Callable[[torch.Tensor, torch.Tensor], object]
KNOWN_TILES = contextlib.ExitStack()  # every tile table's tile fixed, for the process's life
# operations that change a tensor's metadata or allocate, and launch no kernel on a GPU
NO_KERNEL = {
    f"aten.{name}"
    for name in (
        "view.default", "_unsafe_view.default", "_reshape_alias.default", "t.default", "transpose.int",
        "permute.default", "detach.default", "alias.default", "as_strided.default", "slice.Tensor",
        "select.int", "expand.default", "unsqueeze.default", "squeeze.dim", "split.Tensor",
        "split_with_sizes.default", "unbind.int", "empty.memory_format", "empty_strided.default",
        "empty_like.default", "promote_types.default", "lift_fresh.default", "is_same_size.default",
    )
} | {"profiler._record_function_enter_new.default", "profiler._record_function_exit._RecordFunction"}  # fmt: skip
KERNELS = (
    "rms_norm_forward_kernel",
    "rms_norm_backward_kernel",
    "swiglu_forward_kernel",
    "swiglu_backward_kernel",
    "qkv_rope_kernel",
    "cross_entropy_kernel",
)


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


class CountedLaunch:
    """A Triton kernel's `kernel[grid](...)` that counts the launch and runs nothing."""

    def __init__(self, launches: Counter[str], name: str):
        self.launches, self.name = launches, name

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: object, **kwargs: object) -> None:
            self.launches[self.name] += 1

        return launch


def cuda_path_on_cpu(launches: Counter[str]) -> None:
    """The model's CUDA path for CPU tensors: the Triton wrappers taken, their launches counted, each
    kernel's tile known (as on a GPU after the first step, which times them)."""
    if triton_kernels.triton is None:
        raise SystemExit("host_ops needs Triton installed (pip install triton): its wrappers are counted")
    for name in KERNELS:
        setattr(triton_kernels, name, CountedLaunch(launches, name))
    for table in (t for t in vars(triton_ops).values() if isinstance(t, TileTable)):
        KNOWN_TILES.enter_context(table.forced(table.default))
    cuda_wrappers_on_cpu()


def cuda_wrappers_on_cpu(on_call: Callable[[], None] = lambda: None) -> None:
    """The model takes its CUDA path with CPU tensors: the Triton wrappers (their launches stubbed
    out above, or run by Triton's interpreter: tests/trainer/test_step_reads.py), attention in the
    matmul dtype, the loss fused with the output projection. `on_call`: each wrapper taken."""

    def wrappers_for(*tensors: torch.Tensor) -> ModuleType | None:
        if torch.compiler.is_compiling() or any(t.dtype == torch.float64 for t in tensors):
            return None
        on_call()
        return triton_ops

    fused_ops.triton_kernels_for = wrappers_for  # type: ignore[assignment]
    linear_cross_entropy.triton_kernels_for = wrappers_for  # type: ignore[attr-defined]
    # attention in the matmul dtype, as on CUDA (the CPU's runs in float32: llama.attention_dtype)
    llama.attention_dtype = lambda x, head_dim: fused_ops.compute_dtype(x)  # type: ignore[assignment]
    os.environ[FUSED_LOSS_ENV] = "1"  # the loss fused with the output projection, as on CUDA


def ours(cfg: ModelConfig) -> Step:
    """The trainer's step (trainer.run.step): bf16 autocast, the summed loss over the target count,
    backward, the gradient norm clipped, fused AdamW."""
    model = llama.Llama(cfg)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> object:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            predicted, loss = model(x, y, reduction="sum", argmax=True)
        assert loss is not None
        hits = (predicted == y).sum()
        (loss / y.numel()).backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss, norm, hits

    return step


def nanogpt(path: Path, cfg: ModelConfig) -> Step:
    """nanoGPT's train.py step on its own model.py (no bias, dropout 0), the same shape."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", path / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gpt = module.GPTConfig(
        block_size=cfg.ctx, vocab_size=cfg.vocab_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
        n_embd=cfg.n_embd, dropout=0.0, bias=False,
    )  # fmt: skip
    model = module.GPT(gpt)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> object:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss, norm

    return step


def count(step: Step, cfg: ModelConfig, launches: Counter[str]) -> tuple[Counter[str], int]:
    """(aten operations, Triton launches) of one step, after two that set up the optimizer's state."""
    x = torch.randint(0, cfg.vocab_size, (1, cfg.ctx))
    y = torch.randint(0, cfg.vocab_size, (1, cfg.ctx))
    for _ in range(2):
        step(x, y)
    launches.clear()
    with OpCounter() as counter:
        step(x, y)
    return counter.ops, sum(launches.values())


def kernels(ops: Counter[str]) -> int:
    """How many of the operations launch a kernel on a GPU."""
    return sum(n for op, n in ops.items() if op not in NO_KERNEL)


def host_ms(steps: dict[str, Step], cfg: ModelConfig, rounds: int, per_round: int) -> dict[str, float]:
    """Median thread CPU milliseconds a step of each, the steps taken in turn, `per_round` at a time."""
    x = torch.randint(0, cfg.vocab_size, (1, cfg.ctx))
    y = torch.randint(0, cfg.vocab_size, (1, cfg.ctx))
    for step in steps.values():
        for _ in range(3):  # the optimizer's state, the tiles' first choices
            step(x, y)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.thread_time()
            for _ in range(per_round):
                step(x, y)
            times[name].append((time.thread_time() - start) / per_round * 1e3)
    return {name: statistics.median(ms) for name, ms in times.items()}


def narrow(cfg: ModelConfig) -> ModelConfig:
    """cfg's layers, heads and vocabulary, 8 values a head wide: the same operations, little arithmetic."""
    return cfg.model_copy(update={"n_embd": 8 * cfg.n_head, "ffn_dim": 16 * cfg.n_head})


def print_host_time(cfg: ModelConfig, nanogpt_path: Path | None, rounds: int, per_round: int) -> None:
    small = narrow(cfg)
    steps = {"ours": ours(small)}
    if nanogpt_path is not None:
        steps["nanoGPT"] = nanogpt(nanogpt_path, small)
    ms = host_ms(steps, small, rounds, per_round)
    print(
        f"host time a step ({small.n_layer} layers {small.n_embd} wide, thread CPU time, medians of "
        f"{rounds} rounds of {per_round}): " + ", ".join(f"{name} {v:.2f} ms" for name, v in ms.items())
    )
    if "nanoGPT" in ms:
        print(f"ours / nanoGPT: {ms['ours'] / ms['nanoGPT']:.2f}x the host time")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-110m", help="the layers, heads and width counted")
    ap.add_argument("--vocab", type=int, default=258)
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout: its model counted beside ours")
    ap.add_argument("--top", type=int, default=12, help="operations listed, the most frequent first")
    ap.add_argument("--time", type=int, default=0, metavar="ROUNDS", help="also time the host's work a step")
    ap.add_argument("--steps-per-round", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="llama-tiny (the script itself)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    preset = "llama-tiny" if args.smoke else args.preset
    # the counts do not depend on the context or the batch: tiny tensors keep the CPU's work small
    cfg = model_config_from_preset(preset, ctx=16, vocab_size=args.vocab)
    launches: Counter[str] = Counter()
    cuda_path_on_cpu(launches)
    print(f"# host_ops {preset} ({cfg.n_layer} layers, vocab {cfg.vocab_size}): one bf16 training step")
    mine, triton_launches = count(ours(cfg), cfg, launches)
    print(
        f"ours: {sum(mine.values()):,} aten operations a step ({kernels(mine):,} launch a kernel on a GPU), "
        f"{triton_launches} Triton launches"
    )
    rows = [("ours", mine)]
    if args.nanogpt is not None:
        theirs, _ = count(nanogpt(args.nanogpt, cfg), cfg, launches)
        print(
            f"nanoGPT: {sum(theirs.values()):,} aten operations a step ({kernels(theirs):,} launch a kernel "
            "on a GPU; its own fused ops: no Triton)"
        )
        print(
            f"ours / nanoGPT: {sum(mine.values()) / sum(theirs.values()):.2f}x the operations, "
            f"{(kernels(mine) + triton_launches) / kernels(theirs):.2f}x the kernel launches"
        )
        rows.append(("nanoGPT", theirs))
    for name, ops in rows:
        common = ", ".join(f"{op.removeprefix('aten.')} {n}" for op, n in ops.most_common(args.top))
        print(f"{name}, the most frequent: {common}")
    if args.time:
        print_host_time(cfg, args.nanogpt, args.time, args.steps_per_round)
    return 0


if __name__ == "__main__":
    sys.exit(main())
