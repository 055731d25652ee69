"""Celery tasks. Thin: the message carries only a job id; everything else is read from the
database inside `worker.runner.run_job`, so a replayed or duplicated message is harmless."""

from __future__ import annotations

from core.settings import get_settings
from worker.celery_app import app
from worker.runner import run_job


@app.task(name="fromscratch.train_job", ignore_result=True)
def train_job(job_id: str) -> None:
    run_job(job_id, get_settings())
