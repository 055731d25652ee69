"""trainer.config.throughput.StepRate, the smoothed rate behind ETAs and tokens/s: fed step times,
its estimates are checked exactly (no clock is read)."""

from __future__ import annotations

import pytest

from trainer.config.throughput import HALF_LIFE_STEPS, SPIKE, StepRate


def test_no_estimate_before_a_measured_interval() -> None:
    rate = StepRate()
    assert rate.eta(100) is None and rate.tokens_per_s(512) is None
    rate.observe(1, 30.0)  # the warm-up step: not measured
    assert rate.eta(100) is None
    rate.observe(5, 1.0)
    assert rate.seconds_per_step == pytest.approx(0.2)
    assert rate.eta(100) == pytest.approx(20.0)
    assert rate.tokens_per_s(512) == pytest.approx(2560.0)
    assert rate.eta(-3) == 0.0


def test_a_steady_rate_is_estimated_exactly() -> None:
    rate = StepRate(warmup_intervals=0)
    for _ in range(50):
        rate.observe(2, 0.5)
    assert rate.eta(10) == pytest.approx(2.5)


def test_steps_weigh_the_same_whatever_log_every_is() -> None:
    one_by_one, in_one_go = StepRate(warmup_intervals=0), StepRate(warmup_intervals=0)
    one_by_one.observe(1, 1.0)
    in_one_go.observe(1, 1.0)
    for _ in range(20):
        one_by_one.observe(1, 3.0)
    in_one_go.observe(20, 60.0)
    assert one_by_one.seconds_per_step == pytest.approx(in_one_go.seconds_per_step)
    # HALF_LIFE_STEPS steps at the new rate: half way from the old estimate to the new one
    assert in_one_go.seconds_per_step == pytest.approx(2.0) and HALF_LIFE_STEPS == 20


def test_a_noisy_rate_gives_a_steady_estimate() -> None:
    """Two jobs sharing two cores: steps alternate between 1.7k and 14.5k tokens/s (issue 24)."""
    rate = StepRate(start_step=0)
    etas = []
    for step in range(1, 300):
        rate.observe_log(step, 1700.0 if step % 2 else 14500.0, 4096)
        etas.append(rate.eta(300 - step))
    assert etas[0] is None  # step 1: the warm-up
    settled = [eta / (300 - step) for step, eta in enumerate(etas[100:], 101) if eta is not None]
    assert max(settled) / min(settled) < 1.1  # the raw step times differ 8.5x
    mean_step = (4096 / 1700 + 4096 / 14500) / 2
    assert settled[-1] == pytest.approx(mean_step, rel=0.05)


def test_a_one_off_pause_is_capped_and_a_lasting_slowdown_comes_through() -> None:
    rate = StepRate(warmup_intervals=0)
    rate.observe(10, 10.0)
    rate.observe(1, 100.0)  # a compilation inside a step
    weight = 1 - 0.5 ** (1 / HALF_LIFE_STEPS)
    assert rate.seconds_per_step == pytest.approx(1.0 + weight * (SPIKE - 1.0))
    for _ in range(200):
        rate.observe(1, 3.0)  # the device is shared from now on
    assert rate.seconds_per_step == pytest.approx(3.0, rel=1e-3)


def test_log_points_convert_throughput_and_skip_repeats() -> None:
    rate = StepRate(start_step=100)  # a resumed attempt: its first interval is its warm-up
    rate.observe_log(110, 50.0, 1000)
    assert rate.eta(10) is None
    rate.observe_log(120, 2000.0, 1000)  # 10 steps at 0.5 s
    assert rate.seconds_per_step == pytest.approx(0.5)
    rate.observe_log(120, 1.0, 1000)  # the same step again (a replayed point): ignored
    rate.observe_log(115, 1.0, 1000)  # an older one: ignored
    rate.observe_log(130, None, 1000)  # no throughput measured: the steps pass, the estimate stays
    assert rate.seconds_per_step == pytest.approx(0.5) and rate.last_step == 130
