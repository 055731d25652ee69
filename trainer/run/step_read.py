"""Reading a logged step's numbers (loss, gradient norm, accuracy, the ranks' stop code) off the
device without making the host wait for it.

On CUDA the host queues a step's kernels ahead of the GPU. Reading the loss at once (`.tolist()`)
waits for the whole step, and the GPU then idles while the host queues the next step's first
kernels, runs the callbacks and writes metrics.jsonl: a gap at every logged step, and every step is
logged by default. So on CUDA the numbers are copied to pinned host memory behind the step (the
copy queued like a kernel), and read once the next step is queued (trainer.run.loop calls
`Report.read_queued`), when that copy has long finished. A step's report then comes one step late;
a NaN loss still stops the run before any evaluation or checkpoint sees its weights, since the
loop reads the queued step before those.

On the CPU the work is done when the step returns, so the numbers are read at once. The variable
below forces either way (A/B runs on a GPU; tests run the late reads on the CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

ENV = "FROMSCRATCH_DEFERRED_READS"  # "1" / "0": a step's numbers read one step late / at once
DEFAULT_DEVICES = frozenset({"cuda"})


def deferred_reads_on(device_type: str) -> bool:
    """Whether a run on `device_type` reads each logged step's numbers one step late."""
    forced = os.environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return device_type in DEFAULT_DEVICES


@dataclass
class QueuedRead:
    """One logged step's numbers on their way to the host, with what the report says beside them."""

    step: int
    tokens_seen: int
    lr: float
    values: torch.Tensor  # on the host (pinned on CUDA); complete once `copied` has happened
    copied: torch.cuda.Event | None  # None: the values were host memory already

    @classmethod
    def queue(cls, step: int, tokens_seen: int, lr: float, values: torch.Tensor) -> QueuedRead:
        """The values' copy to the host, queued behind the work that computes them."""
        if not values.is_cuda:
            return cls(step, tokens_seen, lr, values, None)
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return cls(step, tokens_seen, lr, host, copied)

    def read(self) -> list[float]:
        """The values, once copied (waiting for the copy alone, not for what was queued after it)."""
        if self.copied is not None:
            self.copied.synchronize()
        values: list[float] = self.values.tolist()
        return values
