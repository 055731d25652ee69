"""The job's progress shows the smoothed rate (trainer.config.throughput): ServiceCallbacks writes
no tokens/s before a measured interval, then the smoothed one; each step's metric row keeps the
step's own; and the API's ETA follows from it (remaining steps x smoothed seconds per step)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.schemas import eta_seconds, tokens_per_step
from core.models import Job, Metric
from core.settings import Settings
from tests.worker.test_service_callbacks import claimed_job, service_callbacks
from trainer.config.metrics import StepMetrics
from trainer.config.throughput import StepRate

RATES = [50.0, 2000.0, 1000.0, 4000.0, 1000.0]  # tokens/s of steps 1..5; step 1 is the warm-up


def start_info(start_step: int, per_step: int) -> dict[str, object]:
    return {
        "total_steps": 100,
        "start_step": start_step,
        "tokens_per_step": per_step,
        "device": "cpu",
        "processes": 1,
        "dtype": "float32",
        "n_params": 1000,
        "auto": [],
        "notes": [],
    }


def test_the_job_shows_the_smoothed_rate_and_rows_keep_their_own(
    settings: Settings, session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    job_id = claimed_job(settings, session_factory)
    with session_factory() as s:  # a previous attempt's rate, which must not stand for this one
        job = s.get(Job, job_id)
        assert job is not None
        job.tokens_per_s, job.status = 99999.0, "running"
        s.commit()
        per_step = tokens_per_step(job)  # as the API counts it from the job's configs
        assert per_step is not None
    cb = service_callbacks(settings, session_factory, job_id, tmp_path)
    cb.on_start(start_info(0, per_step))  # type: ignore[arg-type]
    expected = StepRate(0)
    for n, rate in enumerate(RATES, 1):
        cb.on_step(
            StepMetrics(step=n, train_loss=2.0, lr=1e-3, grad_norm=1.0, tokens_per_s=rate, tokens_seen=n)
        )
        expected.observe_log(n, rate, per_step)
        with session_factory() as s:
            job = s.get(Job, job_id)
            assert job is not None
            if n == 1:
                assert job.tokens_per_s is None and eta_seconds(job) is None  # no guess before a measurement
            else:
                assert job.tokens_per_s == pytest.approx(expected.tokens_per_s(per_step))
    cb.flush(wait=True)
    with session_factory() as s:
        rows = s.scalars(
            select(Metric.tokens_per_s).where(Metric.job_id == job_id).order_by(Metric.step)
        ).all()
        job = s.get(Job, job_id)
        assert job is not None and job.step == 5
        assert list(rows) == RATES
        # the API's ETA: the steps left at the smoothed time per step
        seconds_per_step = expected.seconds_per_step
        assert job.total_steps == 100 and seconds_per_step is not None
        assert eta_seconds(job) == pytest.approx(95 * seconds_per_step, abs=0.1)
