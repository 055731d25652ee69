"""compile auto from measurement (issue 23): a one-process run starts eager, times its first steps
and compiles its transformer blocks (regional compilation) only when that pays back over the steps
left; the arithmetic with a fake clock, and a real run on a tiny model that compiles mid-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.checkpoint import read_state
from trainer.run import precision
from trainer.run.loop import train
from trainer.run.precision import MEASURE_STEPS, MeasuredCompile, compile_from_measurement
from trainer.run.report import Callbacks


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_compiles_only_when_the_steps_left_pay_the_compile_back() -> None:
    cost, speedup = precision.REGIONAL_COMPILE["cpu"]
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


def test_a_run_compiles_its_blocks_mid_run_when_auto_says_so(
    tmp_path: Path,
    tiny_model: Any,
    tiny_train: Any,
    shakespeare_data: Any,
    byte_tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(precision.REGIONAL_COMPILE, "cpu", (0.0, 1.12))  # free: any run pays it back
    notes = Notes()
    cfg = tiny_train(max_steps=8, compile=None, checkpoint_every=0, eval_every=0)
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path, notes, tokenizer=byte_tokenizer)
    assert result.step == 8
    assert len(notes.notes) == 1 and notes.notes[0].startswith(
        f"torch.compile on at step {MEASURE_STEPS + 1}"
    )
    kept = read_state(tmp_path / "final")["precision"]
    assert kept["compile"] is True and "compiling the blocks" in kept["compile_reason"]
