"""compile auto in a one-process run, from measurement (issue 23).

The run starts eager and times its first steps. It then compiles its transformer blocks (regional
compilation: one block's code, compiled once, serves every layer, at half a whole-model compile's
cost) when the time that saves over the steps left pays back the compile time PAYBACK times. The
compile time and speedup are those measured before on this machine (trainer.run.compile_memory: a
worker remembers them per device kind and model shape), else REGIONAL_COMPILE's. A time_limit caps
the steps left.

After compiling, a trial settles whether to keep the compiled blocks: steps alternate between the
compiled and the eager forward, and the two medians are compared. Alternating step by step makes
the comparison fair on a machine whose speed drifts (on a shared 2-core VM, llama-15m's eager steps
took 1.29 s in one 15-minute run and 1.10 s in the next, an hour later), and medians ignore the
steps an evaluation or a checkpoint lengthens. Three compiled steps timed against three earlier
eager ones were not enough: on that VM a run kept compiled blocks and took 1.12x the eager run.
The trial takes TRIAL_SHARE of the steps left (between MEASURE_STEPS and TRIAL_MAX_PAIRS pairs);
half of it runs the slower forward, so it costs at most a few percent of the run. What compiling
cost and gained is remembered for the next run.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

from trainer.run.compile_memory import CompileFigures, CompileMemory, default_figures
from trainer.run.precision import Choice, duration

MEASURE_STEPS = 3  # eager steps timed (after the first, a warm-up) before compile auto decides: their median
PAYBACK = 1.2  # compile when it saves at least this many times what it costs
KEEP_COMPILED_FROM = 1.0  # compiled blocks stay only when their steps run at least this much faster
TRIAL_SHARE = 0.05  # the share of the steps left that the compiled-against-eager trial takes
TRIAL_MAX_PAIRS = 25  # at most this many (eager, compiled) pairs of steps


def compile_from_measurement(
    device_type: str, eager_step_s: float, steps_left: int, figures: CompileFigures | None = None
) -> Choice:
    """Whether compiling the blocks now pays back over `steps_left` steps of `eager_step_s` each,
    by `figures` (REGIONAL_COMPILE's for the device kind when not given)."""
    figures = figures or default_figures(device_type)
    if figures is None:
        return Choice("off", f"auto: no compile on {device_type}")
    if figures.speedup <= 1:  # remembered from a run whose compiled steps were the slower ones
        return Choice(
            "off",
            f"auto: compiled blocks ran {figures.speedup:.2f}x the eager speed ({figures.source}): "
            "no faster, nothing to save",
        )
    saves = steps_left * eager_step_s * (1 - 1 / figures.speedup)
    enough = saves > PAYBACK * figures.cost_s
    return Choice(
        "on" if enough else "off",
        f"auto: eager steps take {eager_step_s * 1000:,.0f} ms; compiling the blocks (~{figures.cost_s:.0f} s, "
        f"{figures.speedup:.2f}x, {figures.source}) would save ~{duration(saves)} over the "
        f"{steps_left:,} steps left, {'over' if enough else 'under'} {PAYBACK:g}x its cost",
    )


def trial_pairs(steps_left: int) -> int:
    """How many (eager, compiled) pairs of steps the trial after compiling takes."""
    return max(MEASURE_STEPS, min(TRIAL_MAX_PAIRS, round(TRIAL_SHARE * steps_left / 2)))


class MeasuredCompile:
    """compile auto's timing: `observe()` at the start of every step returns a decision to apply
    (else None), and `compiled_next` says which forward the coming step runs. Once MEASURE_STEPS
    steps after the first are timed it decides whether to compile. When it compiled, the next step
    compiles, then the trial alternates eager and compiled steps; at its end `measured` says what
    compiling cost and gained, `memory` (when given) remembers it for this shape, and where the
    compiled steps were the slower ones a second decision, "off", gives the run back to eager.
    `sync` waits for the device (CUDA queues steps ahead of the host), so each mark ends a step."""

    def __init__(
        self,
        device_type: str,
        time_limit: float | None,
        clock: Callable[[], float] = time.perf_counter,
        memory: CompileMemory | None = None,
        shape: str = "",
        sync: Callable[[], None] = lambda: None,
    ):
        self.device_type, self.time_limit, self.clock, self.sync = device_type, time_limit, clock, sync
        self.memory, self.shape = memory, shape
        self.marks: list[float] = []
        self.started = clock()
        self.compiled = False  # decided to compile
        self.compiled_next = False  # the forward the coming step runs
        self.pairs = 0  # the trial's length, in (eager, compiled) pairs
        self.trial: list[tuple[bool, float]] = []  # (compiled?, seconds) of each trial step
        self.measured: str | None = None  # the sentence, once the trial is over

    @property
    def done(self) -> bool:
        decided = len(self.marks) >= MEASURE_STEPS + 2
        return decided and (not self.compiled or self.measured is not None)

    def observe(self, steps_left: int) -> Choice | None:
        self.sync()
        self.marks.append(self.clock())
        if len(self.marks) == MEASURE_STEPS + 2:  # the first mark ends the warm-up step
            return self._decide(steps_left)
        if not self.compiled or self.done:
            return None  # still timing the eager steps, eager for good, or measured
        if len(self.marks) > MEASURE_STEPS + 3:  # not the mark that ends the compiling step
            self.trial.append((self.compiled_next, self.marks[-1] - self.marks[-2]))
        if len(self.trial) < 2 * self.pairs:
            self.compiled_next = len(self.trial) % 2 == 1  # eager, compiled, eager...
            return None
        return self._conclude(steps_left)

    def _decide(self, steps_left: int) -> Choice:
        # the median step: one lengthened by something else (an evaluation, a checkpoint) is not
        # the eager step compiling would shorten
        eager = statistics.median(end - start for start, end in itertools.pairwise(self.marks[1:]))
        if self.time_limit is not None:  # the steps a time limit leaves time for
            left_s = max(0.0, self.time_limit - (self.marks[-1] - self.started))
            steps_left = min(steps_left, int(left_s / max(eager, 1e-9)))
        figures = self.memory.figures(self.device_type, self.shape) if self.memory else None
        choice = compile_from_measurement(self.device_type, eager, steps_left, figures)
        self.compiled = self.compiled_next = choice.value == "on"
        self.pairs = trial_pairs(steps_left)
        return choice

    def _conclude(self, steps_left: int) -> Choice | None:
        """The trial's verdict (and what is remembered). Compiled steps slower than the eager ones
        (inductor's code can lose to the eager path's hand-fused kernels) give the decision back:
        eager again, the compile's cost lost but no more."""
        eager_s = statistics.median(s for compiled, s in self.trial if not compiled)
        compiled_s = statistics.median(s for compiled, s in self.trial if compiled)
        compiling_step = self.marks[MEASURE_STEPS + 2] - self.marks[MEASURE_STEPS + 1]
        cost = max(0.0, compiling_step - compiled_s)
        speedup = eager_s / max(compiled_s, 1e-9)
        if self.memory is not None:
            self.memory.remember(self.device_type, self.shape, cost, speedup)
        self.measured = (
            f"torch.compile measured: compiling took {cost:.1f} s; compiled steps {compiled_s * 1000:,.0f} ms "
            f"vs {eager_s * 1000:,.0f} ms eager ({speedup:.2f}x, medians of {self.pairs} steps each, "
            "taken in turn)"
            + (" (remembered for the next run of this shape)" if self.memory is not None else "")
        )
        self.compiled_next = speedup >= KEEP_COMPILED_FROM
        if self.compiled_next:
            return None
        return Choice(
            "off",
            f"auto: the compiled steps ran slower than the eager ones: eager again for the {steps_left:,} "
            "steps left",
        )
