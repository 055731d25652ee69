"""How many threads a CPU run's torch ops use, from measurement.

torch starts one OpenMP thread per core, and each parallel op waits at its end for all of them. When
another process keeps a core busy (the API or an inference worker beside `serve`'s training worker,
a second run, a browser), the thread that shares that core is descheduled and every op waits for it:
on a 2-core VM with one busy process beside it, llama-tiny ran at 8.1k tokens/s on 2 threads and
25k on 1 (31k on 2 with the machine to itself). So a one-process CPU run measures: after every
PERIOD_S seconds of training (and at least 1 / TRIAL_SHARE trials' worth of steps) it times
TRIAL_PAIRS pairs of steps, the current thread count and a neighbour taken in turn, and moves to
the neighbour when its median step is MARGIN faster. The neighbour is one more thread while below
the start (the load may have gone), else one fewer. Steps in turn see the same machine; medians
ignore the steps an evaluation or a checkpoint lengthens.

OMP_NUM_THREADS set, one thread to start with, several processes (their ranks wait for each other)
or another device: the count is left alone. The run gives the start's count back when it ends.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

PERIOD_S = 30.0  # seconds of training between trials
TRIAL_SHARE = 0.05  # at most this share of the steps between trials is spent in them
TRIAL_PAIRS = 4  # (current, neighbour) pairs of steps a trial times
MARGIN = 1.05  # the neighbour must be this much faster to be taken


class ThreadTuner:
    """`observe()` at the start of every step, with the clock; returns a sentence when it changed
    the thread count (else None). `set_threads` applies a count (torch.set_num_threads)."""

    def __init__(
        self,
        start: int,
        set_threads: Callable[[int], None],
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.start, self.threads, self.set_threads, self.clock = start, start, set_threads, clock
        self.last_mark: float | None = None
        self.trained_s = 0.0  # seconds of steps since the last trial
        self.steps_since = 0  # steps since the last trial
        self.trial: list[tuple[int, float]] = []  # (threads, seconds) of the trial's steps
        self.candidate: int | None = None  # the neighbour under trial (None: no trial running)
        self.running = start  # the count the coming step runs with

    def observe(self, step: int, paused: bool = False) -> str | None:
        """Mark the end of the step before; `paused`: that step's time is not a training step's (a
        compile auto trial ran it, whose steps differ on purpose)."""
        now = self.clock()
        took, self.last_mark = (None if self.last_mark is None else now - self.last_mark), now
        if took is None or paused:
            return None
        if self.candidate is None:
            self.trained_s += took
            self.steps_since += 1
            if self._trial_due():
                self._begin_trial()
            return None
        self.trial.append((self.running, took))
        if len(self.trial) < 2 * TRIAL_PAIRS:
            self._run(self.candidate if len(self.trial) % 2 == 1 else self.threads)
            return None
        return self._conclude(step)

    def restore(self) -> None:
        """The start's count back (the process may run another job next)."""
        self._run(self.start)

    def _trial_due(self) -> bool:
        enough_steps = self.steps_since * TRIAL_SHARE >= 2 * TRIAL_PAIRS
        return self.trained_s >= PERIOD_S and enough_steps

    def _begin_trial(self) -> None:
        self.candidate = self.threads + 1 if self.threads < self.start else self.threads - 1
        self.trial = []
        self._run(self.threads)  # the first of each pair: the current count

    def _conclude(self, step: int) -> str | None:
        assert self.candidate is not None
        current = statistics.median(s for n, s in self.trial if n == self.threads)
        neighbour = statistics.median(s for n, s in self.trial if n == self.candidate)
        before, candidate = self.threads, self.candidate
        self.candidate, self.trained_s, self.steps_since = None, 0.0, 0
        if current < neighbour * MARGIN:
            self._run(self.threads)
            return None
        self.threads = candidate
        self._run(candidate)
        return (
            f"cpu threads {before} -> {candidate} at step {step}: steps took {neighbour * 1000:,.0f} ms on "
            f"{candidate} against {current * 1000:,.0f} ms on {before} (medians of {TRIAL_PAIRS}, taken in "
            "turn; other processes share the cores)"
        )

    def _run(self, threads: int) -> None:
        if threads != self.running:
            self.set_threads(threads)
            self.running = threads


def thread_tuner(device_type: str, world: int, threads: int) -> ThreadTuner | None:
    """The tuner of a run on `device_type` in `world` processes starting at `threads`, or None where
    the count is left alone (see the module docstring)."""
    import torch

    if device_type != "cpu" or world > 1 or threads <= 1 or os.environ.get("OMP_NUM_THREADS"):
        return None
    return ThreadTuner(threads, torch.set_num_threads)
