"""The system metrics (the registry's `system` phase) as worker.system_metrics samples them: this
process's CPU use over the time since the previous sample and its resident memory; the device's
only where CUDA is in use. Sampled onto the newest buffered row, never onto a row of its own."""

from __future__ import annotations

import sys
import time

from trainer.config.metrics import of_phase
from worker.system_metrics import SystemSampler


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_sample_measures_this_process_since_the_previous_one() -> None:
    sampler = SystemSampler()
    busy(0.3)
    first = sampler.sample(5)
    assert first.step == 5
    assert first.cpu_percent is not None and first.cpu_percent > 0  # busy: some CPU time per wall time
    assert first.rss_bytes is not None and first.rss_bytes > 10 * 2**20  # this Python, with its imports
    cuda = sys.modules.get("torch")
    if cuda is None or not cuda.cuda.is_initialized():
        assert first.gpu_utilization is None and first.gpu_memory_bytes is None
    time.sleep(0.3)  # idle: the next sample measures only the time since the first
    assert sampler.sample(6).cpu_percent is not None


def test_the_sample_lands_on_the_newest_buffered_row() -> None:
    sampler = SystemSampler()
    rows: dict[int, dict[str, float | None]] = {3: {"train_loss": 2.0}, 4: {"train_loss": 1.9}}
    sampler.add_to(rows)
    assert set(rows[3]) == {"train_loss"}
    assert set(rows[4]) == {"train_loss", *(spec.name for spec in of_phase("system"))}
    empty: dict[int, dict[str, float | None]] = {}
    sampler.add_to(empty)
    assert empty == {}
