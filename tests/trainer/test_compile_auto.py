"""compile auto from measurement (issue 23): a one-process run starts eager, times its first steps
and compiles its transformer blocks (regional compilation) only when that pays back over the steps
left; the arithmetic with a fake clock, and a real run on a tiny model that compiles mid-run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.checkpoint import read_state
from trainer.run import compile_memory, precision
from trainer.run.compile_memory import ENV, CompileFigures, CompileMemory
from trainer.run.loop import train
from trainer.run.precision import MEASURE_STEPS, MeasuredCompile, compile_from_measurement
from trainer.run.report import Callbacks


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_compiles_only_when_the_steps_left_pay_the_compile_back() -> None:
    cost, speedup = compile_memory.REGIONAL_COMPILE["cpu"]
    per_step_saving = 2.0 * (1 - 1 / speedup)  # eager steps of 2 s
    enough = int(precision.PAYBACK * cost / per_step_saving) + 1
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


AutoRun = Callable[[int], tuple[Any, list[str], Path]]


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
    its result, the notes it printed and its folder."""
    monkeypatch.setitem(compile_memory.REGIONAL_COMPILE, "cpu", (0.0, 1.12))

    def run(steps: int) -> tuple[Any, list[str], Path]:
        notes, out = Notes(), tmp_path / "run"
        cfg = tiny_train(max_steps=steps, compile=None, checkpoint_every=0, eval_every=0)
        result = train(tiny_model(), cfg, shakespeare_data, out, notes, tokenizer=byte_tokenizer)
        return result, notes.notes, out

    return run


def test_a_run_compiles_its_blocks_mid_run_when_auto_says_so(
    tmp_path: Path, auto_run: AutoRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "KEEP_COMPILED_FROM", 0.0)  # kept however its steps compare
    memory_file = tmp_path / "compile-times.json"
    monkeypatch.setenv(ENV, str(memory_file))
    result, notes, out = auto_run(2 * MEASURE_STEPS + 4)
    assert result.step == 2 * MEASURE_STEPS + 4
    assert len(notes) == 2 and notes[0].startswith(f"torch.compile on at step {MEASURE_STEPS + 1}")
    assert notes[1].startswith("torch.compile measured: compiling took")
    kept = read_state(out / "final")["precision"]
    assert kept["compile"] is True and "compiling the blocks" in kept["compile_reason"]
    remembered = json.loads(memory_file.read_text())["cpu"]
    assert remembered["newest"]["speedup"] > 0 and len(remembered) == 2  # this shape, and the newest


def test_what_compiling_cost_and_gained_is_remembered_and_counted_on(tmp_path: Path) -> None:
    memory = CompileMemory(tmp_path / "compile-times.json")
    assert memory.figures("cpu", "shape A") == compile_memory.default_figures("cpu")
    clock = FakeClock()
    measured = MeasuredCompile("cpu", None, clock, memory=memory, shape="shape A")
    # warm-up, 3 eager steps of 2 s, the compile (41 s step), 3 compiled steps of 1 s
    for took in [30.0, 2.0, 2.0, 2.0, 41.0, 1.0, 1.0, 1.0]:
        measured.observe(steps_left=10_000)
        clock.now += took
    assert not measured.done and measured.compiled
    assert measured.observe(steps_left=10_000) is None and measured.done
    assert measured.measured is not None and "compiling took 40.0 s" in measured.measured
    figures = memory.figures("cpu", "shape A")
    assert figures is not None and (figures.cost_s, figures.speedup) == (40.0, 2.0)
    assert "this shape" in figures.source
    other = memory.figures("cpu", "shape B")  # an unseen shape: the newest figures of this kind
    assert other is not None and other.cost_s == 40.0 and "another shape" in other.source
    assert memory.figures("cuda", "shape A") == compile_memory.default_figures("cuda")
    # remembered figures change the decision: 40 s at 2x pays back (1.2x) over 49 steps of 2 s, not 40
    assert compile_from_measurement("cpu", 2.0, 49, figures).value == "on"
    assert compile_from_measurement("cpu", 2.0, 40, figures).value == "off"


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
    # warm-up, 3 eager steps of 2 s, the compile (20 s), 3 compiled steps of 2.5 s
    decisions = []
    for took in [30.0, 2.0, 2.0, 2.0, 20.0, 2.5, 2.5, 2.5, 2.0, 2.0]:
        decisions.append(measured.observe(steps_left=10_000))
        clock.now += took
    assert decisions[MEASURE_STEPS + 1] is not None and decisions[MEASURE_STEPS + 1].value == "on"
    back = decisions[2 * MEASURE_STEPS + 2]
    assert back is not None and back.value == "off" and "slower than the eager ones" in back.reason
    assert measured.done and measured.measured is not None and "(0.80x)" in measured.measured
    assert decisions[2 * MEASURE_STEPS + 3 :] == [None]


def test_a_run_whose_compiled_blocks_are_slower_goes_back_to_eager(
    auto_run: AutoRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "KEEP_COMPILED_FROM", float("inf"))  # no compiled step is fast enough
    compiled_calls: list[int] = []
    real_compile = torch.compile

    def counting_compile(fn: Any, *args: Any, **kwargs: Any) -> Any:  # what Module.compile() calls
        compiled = real_compile(fn, *args, **kwargs)

        def counted(*a: Any, **kw: Any) -> Any:
            compiled_calls.append(1)
            return compiled(*a, **kw)

        return counted

    monkeypatch.setattr(torch, "compile", counting_compile)
    steps = 2 * MEASURE_STEPS + 5
    result, notes, out = auto_run(steps)
    assert result.step == steps and len(notes) == 2
    assert notes[0].startswith(f"torch.compile on at step {MEASURE_STEPS + 1}")
    measured, back = notes[1].split("; torch.compile off at step ")
    assert measured.startswith("torch.compile measured: compiling took")
    assert back.startswith(f"{2 * MEASURE_STEPS + 2}: auto: the compiled steps ran slower")
    # the one block ran compiled for the compiling step and the timed ones only, not the steps after
    # nor the final validation
    assert len(compiled_calls) == MEASURE_STEPS + 1
    kept = read_state(out / "final")["precision"]
    assert kept["compile"] is False and "slower than the eager ones" in kept["compile_reason"]
    assert kept["kernels"] != "torch.compile (inductor fuses them)"
