"""The order of trainer_throughput's timed runs, and where a time budget cuts them.

gpu_check gives the throughput step what its 10 minutes leave (bench/_gpu_deadline.py), which on
an H100 is less than every variant takes: there the issue's figures run first (llama-110m, the 1.2B,
llama-110m at nanoGPT's vocabulary, llama-42m; each eager, then compiled), llama-110m eager with
CUDA graphs right after its plain eager run (the host-bound eager step's likeliest way to the eager
goal, never yet timed), and the A/B diagnostics last (torch ops, reads at once), so a budget that
runs out cuts the diagnostics. A run
starts only while the budget lasts, and one that starts runs to its end: the budget is not a limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bench._throughput_report import Row

# the CUDA configs in the order their figures matter to issue 23's goals
CUDA_ORDER = ("llama-110m", "llama-1.2b", "llama-110m-v50k", "llama-42m")


def cuda_priority(row: Row) -> tuple[bool, int, bool, bool]:
    """Sort key: the issue's figures before the diagnostics, by config, eager (then eager graphed)
    before compiled."""
    v = row.variant
    diagnostic = not v.kernels or v.reads_at_once
    rank = CUDA_ORDER.index(v.name) if v.name in CUDA_ORDER else len(CUDA_ORDER)
    return diagnostic, rank, v.compile, v.graphs


@dataclass
class Budget:
    """Seconds from its creation in which new runs may start; None: no budget."""

    seconds: float | None
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (self.clock() - self.start)

    def spent(self) -> bool:
        return self.left() <= 0


def runs_within(rows: list[Row], rounds: int, budget: Budget) -> Iterator[tuple[int, Row]]:
    """(round, row) of every run to time, the rows' order reversed every other round (slow drifts
    cancel out), until the budget is spent."""
    for rnd in range(rounds):
        for row in rows if rnd % 2 == 0 else list(reversed(rows)):
            if budget.spent():
                return
            yield rnd, row
