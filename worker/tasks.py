"""Celery tasks. Thin: a message carries only a row id (a job, an export, an inference request);
everything else is read from the database, so a replayed or duplicated message is harmless.
`train_job` runs on the training queues (cpu, gpu); `export_model` and `inference` on the
`inference` queue, whose workers run a thread pool and keep models loaded."""

from __future__ import annotations

from celery import Task

from core.broker import EXPORT_TASK, INFERENCE_TASK, TRAIN_TASK
from core.settings import get_settings
from worker.celery_app import app
from worker.runner import run_job


@app.task(name=TRAIN_TASK, ignore_result=True)
def train_job(job_id: str) -> None:
    run_job(job_id, get_settings())


@app.task(name=EXPORT_TASK, ignore_result=True)
def export_model(export_id: str) -> None:
    from worker.exports import run_export

    run_export(export_id, get_settings())


@app.task(name=INFERENCE_TASK, ignore_result=True, bind=True)
def inference(self: Task, request_id: str) -> None:
    from worker.inference import run_inference

    run_inference(request_id, get_settings(), worker=self.request.hostname or "")
