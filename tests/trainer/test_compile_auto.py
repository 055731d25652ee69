"""compile auto from measurement (issue 23): a one-process run starts eager, times its first steps,
compiles its transformer blocks (regional compilation) only when that pays back over the steps left,
and keeps them only when a trial of compiled against eager steps finds them faster; the arithmetic
with a fake clock, and real runs on a tiny model that compile mid-run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
import torch

from tests.fake_clock import FakeClock
from trainer.checkpoint import read_state
from trainer.run import compile_memory, measured_compile, state
from trainer.run.compile_memory import ENV, CompileFigures, CompileMemory
from trainer.run.loop import train
from trainer.run.measured_compile import (
    MEASURE_STEPS,
    MeasuredCompile,
    compile_from_measurement,
    trial_pairs,
)
from trainer.run.precision import Choice
from trainer.run.report import Callbacks

COMPILING_STEP = MEASURE_STEPS + 1  # warm-up and timed eager steps, then the step that compiles
VERDICT_STEP = COMPILING_STEP + 1 + 2 * MEASURE_STEPS  # after the shortest trial


def test_it_compiles_only_when_the_steps_left_pay_the_compile_back() -> None:
    cost, speedup = compile_memory.REGIONAL_COMPILE["cpu"]
    per_step_saving = 2.0 * (1 - 1 / speedup)  # eager steps of 2 s
    enough = int(measured_compile.PAYBACK * cost / per_step_saving) + 1
    assert compile_from_measurement("cpu", 2.0, enough).value == "on"
    off = compile_from_measurement("cpu", 2.0, enough - 2)
    assert off.value == "off" and "2,000 ms" in off.reason and "under" in off.reason
    assert compile_from_measurement("mps", 2.0, 10**9).value == "off"


def test_it_decides_after_timing_the_steps_after_the_first() -> None:
    clock = FakeClock()
    measured = MeasuredCompile("cpu", None, clock)
    decisions = []
    for step, took in enumerate([30.0, 2.0, 2.0, 2.0, 2.0, 2.0]):  # the first: a slow warm-up
        decisions.append(measured.observe(steps_left=10_000 - step))
        clock.now += took
    assert decisions[: MEASURE_STEPS + 1] == [None] * (MEASURE_STEPS + 1)
    decided = decisions[MEASURE_STEPS + 1]
    assert decided is not None and decided.value == "on" and "2,000 ms" in decided.reason
    assert decisions[MEASURE_STEPS + 2 :] == [None]  # once


def test_one_timed_step_lengthened_by_something_else_does_not_make_the_eager_step() -> None:
    clock = FakeClock()
    measured = MeasuredCompile("cpu", None, clock)
    decided = None
    for took in [30.0, 2.0, 9.0, 2.0, 2.0]:  # the warm-up, then an evaluation in a timed step
        decided = measured.observe(steps_left=10_000) or decided
        clock.now += took
    assert decided is not None and "2,000 ms" in decided.reason


def test_checkpoint_buffers_are_pinned_only_once_compile_auto_has_stopped_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pinning them takes the CUDA driver for a while: compile auto must not time steps beside it."""
    reserved: list[object] = []
    monkeypatch.setattr(state, "buffer_plan", lambda *args: {"plan": None})
    run = SimpleNamespace(
        buffers_planned=False,
        device=torch.device("cuda"),
        optimizer=SimpleNamespace(state={"a parameter": {}}),
        compile_auto=MeasuredCompile("cuda", None, FakeClock()),
        is_main=True,
        sharded=False,
        cfg=SimpleNamespace(checkpoint_every=60),
        writer=SimpleNamespace(reserve=reserved.append),
        model=None,
        model_cfg=None,
    )
    state.TrainRun._reserve_buffers(run)  # type: ignore[arg-type]
    assert reserved == [] and not run.buffers_planned
    run.compile_auto = None  # decided (and, had it compiled, its trial over)
    state.TrainRun._reserve_buffers(run)  # type: ignore[arg-type]
    state.TrainRun._reserve_buffers(run)  # type: ignore[arg-type]
    assert reserved == [{"plan": None}]


def test_a_time_limit_caps_the_steps_it_counts_on() -> None:
    clock = FakeClock()
    measured = MeasuredCompile("cpu", time_limit=20.0, clock=clock)
    for _ in range(MEASURE_STEPS + 1):
        assert measured.observe(steps_left=10**6) is None
        clock.now += 2.0
    decided = measured.observe(steps_left=10**6)  # 8 s gone, 12 s left: 6 steps, not a million
    assert decided is not None and decided.value == "off" and " 6 steps left" in decided.reason


class Notes(Callbacks):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def on_note(self, message: str) -> None:
        self.notes.append(message)


AutoRun = Callable[..., tuple[Any, list[str], Path]]


@pytest.fixture
def auto_run(
    tmp_path: Path,
    tiny_model: Any,
    tiny_train: Any,
    shakespeare_data: Any,
    byte_tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> AutoRun:
    """A real tiny run of so many steps with compile auto, compiling free (any run pays it back):
    its result, the notes it printed and its folder (`notes`: callbacks of the test's own)."""
    monkeypatch.setitem(compile_memory.REGIONAL_COMPILE, "cpu", (0.0, 1.12))

    def run(steps: int, notes: Notes | None = None) -> tuple[Any, list[str], Path]:
        notes, out = notes or Notes(), tmp_path / "run"
        cfg = tiny_train(max_steps=steps, compile=None, checkpoint_every=0, eval_every=0)
        result = train(tiny_model(), cfg, shakespeare_data, out, notes, tokenizer=byte_tokenizer)
        return result, notes.notes, out

    return run


def test_a_run_compiles_its_blocks_mid_run_when_auto_says_so(
    tmp_path: Path, auto_run: AutoRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(measured_compile, "KEEP_COMPILED_FROM", 0.0)  # kept however its steps compare
    memory_file = tmp_path / "compile-times.json"
    monkeypatch.setenv(ENV, str(memory_file))
    result, notes, out = auto_run(VERDICT_STEP + 2)
    assert result.step == VERDICT_STEP + 2
    assert len(notes) == 2 and notes[0].startswith(f"torch.compile on at step {COMPILING_STEP}")
    assert notes[1].startswith("torch.compile measured: compiling took")
    kept = read_state(out / "final")["precision"]
    assert kept["compile"] is True and "compiling the blocks" in kept["compile_reason"]
    remembered = json.loads(memory_file.read_text())["cpu"]
    assert remembered["newest"]["speedup"] > 0 and len(remembered) == 2  # this shape, and the newest


def test_a_pause_asked_for_while_compile_auto_decides_stops_before_the_compile(auto_run: AutoRun) -> None:
    """The service reads cancel and pause requests when it writes a decision's note: a pause asked
    for just then used to wait for the step the decision compiles (76 s on a 2-core VM)."""

    class PausedWithTheNote(Notes):
        def should_stop(self) -> Literal["pause"] | None:
            return "pause" if self.notes else None

    result, notes, _ = auto_run(50, PausedWithTheNote())
    assert notes[0].startswith(f"torch.compile on at step {COMPILING_STEP}"), notes
    assert result.stop_reason == "pause" and result.step == COMPILING_STEP


StepSeconds = Callable[[int, bool], float]  # (step, runs compiled) -> how long the step took
Driven = tuple[list[Choice | None], list[bool]]  # the decisions, and which steps ran compiled
PAIRS = trial_pairs(10_000)
LONG_VERDICT_STEP = COMPILING_STEP + 1 + 2 * PAIRS  # the trial of a 10,000-step run


def step_times(eager: float, compiling: float, compiled: float) -> StepSeconds:
    """A 30 s warm-up, then eager steps, the compiling step and compiled steps of so many seconds."""

    def seconds(step: int, runs_compiled: bool) -> float:
        if step == 0:
            return 30.0
        if step == COMPILING_STEP and runs_compiled:
            return compiling
        return compiled if runs_compiled else eager

    return seconds


def drive(measured: MeasuredCompile, clock: FakeClock, seconds: StepSeconds, steps: int) -> Driven:
    """Runs `steps` steps of a 10,000-step run: its decisions, and which steps ran compiled."""
    decisions, modes = [], []
    for step in range(steps):
        decisions.append(measured.observe(steps_left=10_000 - step))
        modes.append(measured.compiled_next)
        clock.now += seconds(step, measured.compiled_next)
    return decisions, modes


def test_the_trial_takes_a_share_of_the_steps_left_within_bounds() -> None:
    assert trial_pairs(10) == MEASURE_STEPS
    assert trial_pairs(400) == round(400 * measured_compile.TRIAL_SHARE / 2) > MEASURE_STEPS
    assert trial_pairs(10**6) == measured_compile.TRIAL_MAX_PAIRS


def test_what_compiling_cost_and_gained_is_remembered_and_counted_on(tmp_path: Path) -> None:
    memory = CompileMemory(tmp_path / "compile-times.json")
    assert memory.figures("cpu", "shape A") == compile_memory.default_figures("cpu")
    clock = FakeClock()
    measured = MeasuredCompile("cpu", None, clock, memory=memory, shape="shape A")
    plain = step_times(eager=2.0, compiling=41.0, compiled=1.0)

    def with_an_evaluation(step: int, runs_compiled: bool) -> float:  # one step lengthened: ignored
        return 60.0 if step == COMPILING_STEP + 2 else plain(step, runs_compiled)

    decisions, modes = drive(measured, clock, with_an_evaluation, LONG_VERDICT_STEP)
    assert not measured.done and measured.compiled
    # eager steps, the compiling one, then eager and compiled steps in turn
    assert modes == [False] * COMPILING_STEP + [True] + [False, True] * PAIRS
    assert decisions[COMPILING_STEP + 1 :] == [None] * 2 * PAIRS
    assert measured.observe(steps_left=10_000) is None and measured.done and measured.compiled_next
    assert measured.measured is not None and "compiling took 40.0 s" in measured.measured
    assert f"(2.00x, medians of {PAIRS} steps each" in measured.measured
    figures = memory.figures("cpu", "shape A")
    assert figures is not None and (figures.cost_s, figures.speedup) == (40.0, 2.0)
    assert "this shape" in figures.source
    other = memory.figures("cpu", "shape B")  # an unseen shape: the newest figures of this kind
    assert other is not None and other.cost_s == 40.0 and "another shape" in other.source
    assert memory.figures("cuda", "shape A") == compile_memory.default_figures("cuda")
    # remembered figures change the decision: 40 s at 2x pays back (1.2x) over 49 steps of 2 s, not 40
    assert compile_from_measurement("cpu", 2.0, 49, figures).value == "on"
    assert compile_from_measurement("cpu", 2.0, 40, figures).value == "off"
    slower = compile_memory.CompileFigures(1.0, 0.97, "measured here on another shape")
    off = compile_from_measurement("cpu", 2.0, 10**6, slower)  # no saving, not a negative one
    assert off.value == "off" and "0.97x the eager speed" in off.reason and "~-" not in off.reason


def test_steps_taken_in_turn_see_through_a_machine_slowing_down() -> None:
    """Compiled steps 5% faster on a machine slowing 2% a step: timed after the eager ones they would
    look slower; timed in turn with eager steps they are found faster, and kept."""
    clock = FakeClock()
    measured = MeasuredCompile("cpu", None, clock)
    base = step_times(eager=2.0, compiling=20.0, compiled=1.9)

    def slowing(step: int, runs_compiled: bool) -> float:
        return base(step, runs_compiled) * (1 + 0.02 * step)

    decisions, _ = drive(measured, clock, slowing, LONG_VERDICT_STEP + 5)
    assert decisions[COMPILING_STEP] is not None and decisions[COMPILING_STEP].value == "on"
    assert decisions[COMPILING_STEP + 1 :] == [None] * (2 * PAIRS + 5)
    assert measured.done and measured.compiled_next and measured.measured is not None
    assert "(1.0" in measured.measured  # 0.95 x 1.02 steps apart: ~1.03x


def test_a_run_that_stays_eager_measures_nothing_more() -> None:
    clock = FakeClock()
    measured = MeasuredCompile("cpu", None, clock)
    for _ in range(MEASURE_STEPS + 1):
        measured.observe(steps_left=3)
        clock.now += 1.0
    decided = measured.observe(steps_left=3)
    assert decided is not None and decided.value == "off" and measured.done and measured.measured is None


def test_an_unreadable_memory_file_falls_back_to_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "compile-times.json"
    path.write_text("{half a file")
    assert CompileMemory(path).figures("cuda", "s") == compile_memory.default_figures("cuda")
    CompileMemory(path).remember("cuda", "s", 5.0, 1.5)
    assert CompileMemory(path).figures("cuda", "s") == CompileFigures(5.0, 1.5, "measured here on this shape")


def test_compiled_steps_slower_than_eager_ones_give_the_decision_back() -> None:
    clock = FakeClock()
    measured = MeasuredCompile("cpu", None, clock)
    slower = step_times(eager=2.0, compiling=20.0, compiled=2.5)
    decisions, modes = drive(measured, clock, slower, LONG_VERDICT_STEP + 3)
    assert decisions[COMPILING_STEP] is not None and decisions[COMPILING_STEP].value == "on"
    back = decisions[LONG_VERDICT_STEP]
    assert back is not None and back.value == "off" and "slower than the eager ones" in back.reason
    assert measured.done and measured.measured is not None and "(0.80x," in measured.measured
    assert decisions[LONG_VERDICT_STEP + 1 :] == [None, None] and modes[LONG_VERDICT_STEP:] == [False] * 3


def test_a_run_whose_compiled_blocks_are_slower_goes_back_to_eager(
    auto_run: AutoRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        measured_compile, "KEEP_COMPILED_FROM", float("inf")
    )  # no compiled step is fast enough
    compiled_calls: list[int] = []
    real_compile = torch.compile

    def counting_compile(fn: Any, *args: Any, **kwargs: Any) -> Any:  # what Module.compile() calls
        compiled = real_compile(fn, *args, **kwargs)

        def counted(*a: Any, **kw: Any) -> Any:
            compiled_calls.append(1)
            return compiled(*a, **kw)

        return counted

    monkeypatch.setattr(torch, "compile", counting_compile)
    steps = VERDICT_STEP + 3
    result, notes, out = auto_run(steps)
    assert result.step == steps and len(notes) == 2
    assert notes[0].startswith(f"torch.compile on at step {COMPILING_STEP}")
    measured, back = notes[1].split("; torch.compile off at step ")
    assert measured.startswith("torch.compile measured: compiling took")
    assert back.startswith(f"{VERDICT_STEP}: auto: the compiled steps ran slower")
    # the one block ran compiled for the compiling step and the trial's compiled steps only, not its
    # eager ones, the steps after nor the final validation
    assert len(compiled_calls) == MEASURE_STEPS + 1
    kept = read_state(out / "final")["precision"]
    assert kept["compile"] is False and "slower than the eager ones" in kept["compile_reason"]
    assert kept["kernels"] != "torch.compile (inductor fuses them)"
