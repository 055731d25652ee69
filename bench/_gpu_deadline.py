"""gpu_check's clock: the whole call fits its --minutes (the device tool stops a call at 10) and
still prints its table. Until 2026-11-27 each step had only its own limit; that day's H100 call
ran past the tool's 10 minutes in its last step and the table was never printed.

Each step keeps, for the steps after it, the time they took on that H100 (EXPECTED_SECONDS); its
own limit is cut to what is left beyond that. A step that would get less than half its expected
time is not run, and the table says so. The throughput step is elastic (its runs are ordered by
what the issue needs: bench/_run_plan.py) and is told its share as a budget for starting runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench._run_plan import Budget

# seconds each step took on an H100 on 2026-11-27 (throughput: the runs of the figures;
# profile, checkpoints, peer and compile_policy, which are opt-in: as their limits allow)
EXPECTED_SECONDS = {
    "machine": 6,
    "tests": 94,
    "kernels": 16,
    "throughput": 240,
    "profile": 90,
    "nanogpt": 52,
    "checkpoints": 240,
    "inference": 30,
    "service": 57,
    "peer": 300,
    "compile_policy": 600,
}
TABLE_SECONDS = 10  # the table, its JSON and the scratch folder's removal
# a run the throughput step starts just before its budget ends still runs: the 1.2B compiled takes
# about a minute on an H100
RUN_OVERRUN_SECONDS = 75
BUDGETED = {"throughput": "--budget"}  # steps told their share, and the option that says it


@dataclass
class Deadline:
    """The call's end, `minutes` after its creation; None: no deadline (each step's own limit)."""

    minutes: float | None
    smoke: bool = False  # --smoke: the steps take seconds, none is kept any time for
    clock: Callable[[], float] = time.monotonic
    call: Budget = field(init=False)

    def __post_init__(self) -> None:
        self.call = Budget(None if self.minutes is None else self.minutes * 60, self.clock)

    def expected(self, step: str) -> float:
        return 0.0 if self.smoke else EXPECTED_SECONDS[step]

    def allot(self, step: str, limit: int, later: Sequence[str]) -> int | None:
        """The step's time limit, or None when it is not to run: too little is left for it."""
        if self.minutes is None:
            return limit
        room = self.call.left() - TABLE_SECONDS - sum(self.expected(s) for s in later)
        if room < max(1.0, self.expected(step) / 2):
            return None
        return int(min(limit, room))

    def options(self, step: str, allotted: int) -> list[str]:
        """What a budgeted step is told of its share (a run it starts may overrun the budget)."""
        if step not in BUDGETED or self.minutes is None:
            return []
        overrun = 0 if self.smoke else RUN_OVERRUN_SECONDS
        return [BUDGETED[step], str(max(1, allotted - overrun))]
