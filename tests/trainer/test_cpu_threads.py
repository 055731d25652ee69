"""A CPU run's thread count from measurement (trainer/run/cpu_threads.py): on a simulated machine
(a fake clock whose step times depend on the thread count and on another process's load) the tuner
moves to fewer threads while the load lasts and back when it goes, leaves a quiet machine alone,
keeps its trials to a small share of the steps, ignores compile auto's trial steps; and a real run
wires it in (its note, the count given back at the end)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.run import cpu_threads
from trainer.run.cpu_threads import TRIAL_SHARE, ThreadTuner, thread_tuner

QUIET = {2: 0.030, 1: 0.040}  # s/step: 2 threads win on an idle 2-core machine
LOADED = {2: 0.120, 1: 0.040}  # another busy process: the second thread stalls every op


class Machine:
    """Steps whose time follows the thread count the tuner set and the load of the moment."""

    def __init__(self, load: Callable[[int], bool]):
        self.now, self.load = 0.0, load
        self.counts: list[int] = []  # the thread count of each step
        self.tuner = ThreadTuner(2, lambda n: None, clock=lambda: self.now)

    def run(self, steps: int, paused: Callable[[int], bool] = lambda step: False) -> list[str]:
        notes = []
        for step in range(steps):
            if (note := self.tuner.observe(step, paused(step))) is not None:
                notes.append(note)
            threads = self.tuner.running
            self.counts.append(threads)
            self.now += (LOADED if self.load(step) else QUIET)[threads]
        return notes


def at_step(note: str) -> int:
    return int(note.split(" at step ")[1].split(":")[0])


def test_fewer_threads_while_another_process_is_busy_and_back_after() -> None:
    machine = Machine(load=lambda step: step < 2000)
    notes = machine.run(4000)
    assert notes[0].startswith("cpu threads 2 -> 1 at step ") and "40 ms on 1 against 120 ms on 2" in notes[0]
    assert notes[1].startswith("cpu threads 1 -> 2 at step ") and at_step(notes[1]) > 2000
    assert len(notes) == 2 and machine.counts[-1] == 2
    switched = at_step(notes[0])
    assert switched < 500  # within the first trial: ~30 s of training
    assert machine.counts[switched + 1 : 2000].count(1) > 0.9 * (2000 - switched)


def test_a_quiet_machine_keeps_its_threads_and_trials_cost_a_small_share() -> None:
    machine = Machine(load=lambda step: False)
    assert machine.run(20_000) == []
    assert machine.counts.count(1) <= TRIAL_SHARE / 2 * len(machine.counts) + 2 * cpu_threads.TRIAL_PAIRS


def test_slow_steps_space_trials_out_by_steps_not_only_seconds() -> None:
    machine = Machine(load=lambda step: False)
    machine.tuner.clock = lambda: machine.now * 100  # 3-12 s steps: PERIOD_S passes every few steps
    machine.run(2000)
    trial_steps = machine.counts.count(1)
    assert 0 < trial_steps <= TRIAL_SHARE / 2 * 2000 + cpu_threads.TRIAL_PAIRS


def test_compile_auto_trial_steps_are_neither_counted_nor_a_thread_trial() -> None:
    machine = Machine(load=lambda step: True)
    assert machine.run(3000, paused=lambda step: True) == [] and set(machine.counts) == {2}
    assert machine.tuner.trained_s == 0.0


def test_restore_gives_the_start_back() -> None:
    applied: list[int] = []
    tuner = ThreadTuner(4, applied.append, clock=lambda: 0.0)
    tuner.threads = tuner.running = 2
    tuner.restore()
    assert applied == [4] and tuner.running == 4


@pytest.mark.parametrize(
    ("device", "world", "threads", "env", "tuned"),
    [
        ("cpu", 1, 2, None, True),
        ("cuda", 1, 2, None, False),
        ("cpu", 2, 2, None, False),
        ("cpu", 1, 1, None, False),
        ("cpu", 1, 2, "2", False),  # OMP_NUM_THREADS: the count asked for, kept
    ],
)
def test_which_runs_are_tuned(
    monkeypatch: pytest.MonkeyPatch, device: str, world: int, threads: int, env: str | None, tuned: bool
) -> None:
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert (thread_tuner(device, world, threads) is not None) == tuned


def test_a_run_applies_the_tuner_and_gives_its_threads_back(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny_model: Any,
    tiny_train: Any,
    shakespeare_data: Any,
    byte_tokenizer: Any,
) -> None:
    """The loop observes every step and reports the change; a simulated clock makes one thread the
    faster (the real steps' times say nothing reliable here)."""
    from tests.trainer.test_loop import Recorder
    from trainer.run.loop import train

    applied: list[int] = []
    before = torch.get_num_threads()
    now = [0.0]

    def machine_clock() -> float:  # each call ends a step: 1 s on one thread, 3 s on two
        now[0] += 1.0 if applied and applied[-1] == 1 else 3.0
        return now[0]

    def factory(device_type: str, world: int, threads: int) -> ThreadTuner:
        return ThreadTuner(2, applied.append, clock=machine_clock)

    monkeypatch.setattr("trainer.run.setup.thread_tuner", factory)
    rec = Recorder()
    notes: list[str] = []
    rec.on_note = notes.append  # type: ignore[method-assign]
    cfg = tiny_train(max_steps=300, eval_every=0)
    train(tiny_model(), cfg, shakespeare_data, tmp_path, rec, tokenizer=byte_tokenizer)
    assert any(n.startswith("cpu threads 2 -> 1 at step ") for n in notes), notes
    assert applied[-1] == 2  # the start's count given back at the end
    assert torch.get_num_threads() == before  # the fake applied nothing to torch itself
