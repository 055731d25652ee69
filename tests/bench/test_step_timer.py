"""bench/_timed_training.StepTimer, on a fake clock: each timed step's duration and the matmul peak
beside it; measured after every step on the CPU, and on CUDA only where the timed steps start and
after the last (a measurement between steps would break CUDA's late reads, trainer.run.step_read)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import _timed_training
from bench._timed_training import EnoughSteps, StepTimer
from trainer.config.metrics import StepMetrics

STEP_SECONDS = [0.5, 0.4, 0.1, 0.2, 0.3, 0.25]  # a warm-up step, then five timed ones


def run_timer(monkeypatch: pytest.MonkeyPatch, device: str) -> tuple[StepTimer, list[int]]:
    """Five timed steps after one warm-up step; the n-th peak measured reads n * 100 GFLOP/s."""
    now = [0.0]
    monkeypatch.setattr(_timed_training, "clock", lambda: now[0])
    monkeypatch.setattr(StepTimer, "_read_peak_memory", lambda self: None)  # no CUDA here
    measured_after: list[int] = []

    def peak() -> dict[str, float]:
        measured_after.append(len(timer.durations))
        return {"bf16": 100.0 * len(measured_after)}

    timer = StepTimer(1, 5, 0.0, torch.device(device), peak)
    timer.on_start({})  # type: ignore[arg-type]
    with pytest.raises(EnoughSteps):
        for step, seconds in enumerate(STEP_SECONDS, 1):
            now[0] += seconds
            metrics = StepMetrics(
                step=step, train_loss=1.0, lr=1e-3, grad_norm=1.0, tokens_per_s=1.0, tokens_seen=step
            )
            timer.on_step(metrics)
    return timer, measured_after


def test_on_the_cpu_every_timed_step_has_the_peaks_measured_either_side(monkeypatch) -> None:
    timer, measured_after = run_timer(monkeypatch, "cpu")
    assert measured_after == [1, 2, 3, 4, 5, 6]
    assert timer.timed() == [
        (pytest.approx(s), {"bf16": pytest.approx(100 * i + 50)}) for i, s in enumerate(STEP_SECONDS[1:], 1)
    ]


def test_on_cuda_the_peaks_are_measured_where_the_timed_steps_start_and_end(monkeypatch) -> None:
    timer, measured_after = run_timer(monkeypatch, "cuda")
    assert measured_after == [1, 6]  # after the warm-up step, and after the last timed one
    assert timer.timed() == [(pytest.approx(s), {"bf16": pytest.approx(150.0)}) for s in STEP_SECONDS[1:]]
