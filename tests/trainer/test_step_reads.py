"""What a CUDA training step reads back from the device, checked on the CPU (issue 23).

On a GPU every read of a device value (`.item()`, `.tolist()`, `bool(t)`, `nonzero`) makes the
host wait for the work queued before it, and the GPU then idles while the host queues what comes
next: one such read inside the step serializes the host's launches and the GPU's kernels. The H100
run of 2026-11-27 found llama-110m's eager step at 54 ms around 28 ms of kernels, so this file pins
down that the step reads nothing but what it is meant to: the step's numbers, one step late
(trainer/run/step_read.py), and the target count of the batch while it is still on the host.

The run takes the CUDA path on CPU tensors: the Triton kernels run in Triton's interpreter (which
must be set before Triton loads, so the training runs in a process of its own: this file, run as a
script), the loss fused with the output projection and each step's numbers read a step late, as on
CUDA. Every read of a tensor's value from the third step on is recorded with the project function
that made it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# aten operations whose result the host needs at once (a device sync on CUDA)
READING_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.equal.default"}
READING_METHODS = ("tolist", "numpy", "cpu", "item")
PROJECT = {"trainer", "worker", "core", "bench"}  # where a reader is named (not torch, not this file)
STEPS = 8  # of the run; reads are recorded from the third
# what the step is meant to read, as (what, the project function that reads)
MEANT = {
    # the batch's target count, counted on the host before the batch moves (no sync)
    ("aten._local_scalar_dense.default", "trainer/run/step.py:count_targets"),
    # the previous step's numbers, from pinned memory, once this step is queued
    ("Tensor.tolist", "trainer/run/step_read.py:read"),
}


def test_a_cuda_step_reads_only_its_numbers_a_step_late_and_the_hosts_target_count() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, __file__], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["triton_calls"] > 0  # the Triton wrappers ran: the CUDA path, not the CPU's C kernels
    assert {tuple(site) for site in report["reads"]} == MEANT


def _reader(stack: list[traceback.FrameSummary]) -> str:
    """The innermost project function on the stack."""
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(REPO_ROOT) and path.relative_to(REPO_ROOT).parts[0] in PROJECT:
            return f"{path.relative_to(REPO_ROOT)}:{frame.name}"
    return "?"


def main() -> None:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from bench.host_ops import cuda_wrappers_on_cpu
    from trainer.config import ModelConfig, TrainConfig
    from trainer.config.metrics import StepMetrics
    from trainer.run.loop import train
    from trainer.run.report import Callbacks
    from trainer.run.step_read import ENV as DEFERRED_READS

    reads: set[tuple[str, str]] = set()
    counts = {"triton_calls": 0}
    recording = [False]

    def count_call() -> None:
        counts["triton_calls"] += 1

    cuda_wrappers_on_cpu(count_call)
    os.environ[DEFERRED_READS] = "1"  # a step's numbers read a step late, as on CUDA

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if str(func) in READING_OPS:
                reads.add((str(func), _reader(traceback.extract_stack())))
            return func(*args, **(kwargs or {}))

    def recorded(name: str) -> Any:
        method = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if recording[0]:
                reads.add((f"Tensor.{name}", _reader(traceback.extract_stack())))
            return method(self, *args, **kwargs)

        return read

    for name in READING_METHODS:
        setattr(torch.Tensor, name, recorded(name))
    mode = Reads()

    class StepsThreeToLast(Callbacks):
        """Records from the report of step 2 (step 3 is queued by then: reports come a step late)
        to that of the last step, which the loop reads after its last step, before the final
        checkpoint's reads."""

        def on_step(self, metrics: StepMetrics) -> None:
            if metrics.step == 2:
                recording[0] = True
                mode.__enter__()
            elif metrics.step == STEPS:
                recording[0] = False
                mode.__exit__(None, None, None)

    model = ModelConfig(n_layer=1, n_head=2, n_embd=32, ctx=16, vocab_size=258)
    cfg = TrainConfig(
        max_steps=STEPS, batch_size=1, warmup_steps=2, eval_every=0, checkpoint_every=0, log_every=1,
        device="cpu", dtype="bfloat16", compile=False,
    )  # fmt: skip
    text = REPO_ROOT / "tests" / "data" / "tiny_shakespeare_100k.txt"
    try:
        with tempfile.TemporaryDirectory() as out:
            train(model, cfg, text, Path(out), StepsThreeToLast())
    finally:
        if recording[0]:
            mode.__exit__(None, None, None)
    print(json.dumps({"triton_calls": counts["triton_calls"], "reads": sorted(reads)}))


if __name__ == "__main__":
    main()
