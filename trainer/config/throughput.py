"""The training rate behind every ETA and throughput figure: an exponential moving average of the
time per step, over the measured training time of the recent steps (no torch; the trainer's progress
display, the worker and the client use it alike).

Each logged interval (the steps between two log points) brings its step count and its training time,
with the time spent evaluating and writing checkpoints already left out (trainer.run.report's clock).
So that one estimate holds from one read to the next:

- the first interval of a run, or of a resumed attempt, is its warm-up (allocations, kernel caches,
  the first batches) and is not measured: there is no estimate before a measured interval, and none
  is ever guessed from FLOPs;
- each step weighs the same whatever `log_every` is: an interval of k steps moves the average as k
  steps of one would (half the weight is on the last HALF_LIFE_STEPS steps);
- an interval more than SPIKE times slower per step than the average (a compilation, a page-in) counts
  as SPIKE times: a lasting slowdown (another job on the same device) still lifts the estimate within
  a few dozen steps, a one-off pause no longer swings it.
"""

from __future__ import annotations

import math

HALF_LIFE_STEPS = 20.0
SPIKE = 4.0


class StepRate:
    """seconds per step, smoothed; feed it `observe(steps, seconds)` or `observe_log(...)`."""

    def __init__(
        self,
        start_step: int = 0,
        *,
        half_life_steps: float = HALF_LIFE_STEPS,
        warmup_intervals: int = 1,
        spike: float = SPIKE,
    ):
        self.half_life_steps, self.spike = half_life_steps, spike
        self.last_step = start_step
        self.warmup_left = warmup_intervals
        self.seconds_per_step: float | None = None

    def observe(self, steps: int, seconds: float) -> None:
        """An interval of `steps` steps that took `seconds` of training time."""
        if steps <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        if self.warmup_left > 0:
            self.warmup_left -= 1
            return
        per_step = seconds / steps
        if self.seconds_per_step is None:
            self.seconds_per_step = per_step
            return
        per_step = min(per_step, self.spike * self.seconds_per_step)
        weight = 1.0 - 0.5 ** (steps / self.half_life_steps)
        self.seconds_per_step += weight * (per_step - self.seconds_per_step)

    def observe_log(self, step: int, tokens_per_s: float | None, tokens_per_step: int) -> None:
        """A log point: `step` and the interval's training throughput since the previous one (what a
        step's `tokens_per_s` metric is). An older or repeated step is ignored."""
        steps = step - self.last_step
        if steps <= 0:
            return
        self.last_step = step
        if tokens_per_s is None or not tokens_per_s > 0 or tokens_per_step <= 0:
            return
        self.observe(steps, steps * tokens_per_step / tokens_per_s)

    def eta(self, steps_left: int) -> float | None:
        """Seconds of training left for `steps_left` steps (None before a measured interval)."""
        if self.seconds_per_step is None:
            return None
        return max(steps_left, 0) * self.seconds_per_step

    def tokens_per_s(self, tokens_per_step: int) -> float | None:
        """The smoothed throughput (None before a measured interval)."""
        if self.seconds_per_step is None or self.seconds_per_step <= 0:
            return None
        return tokens_per_step / self.seconds_per_step
