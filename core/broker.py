"""Celery wiring shared by the API (sends) and the worker (consumes).

The message carries only a job id; the task re-reads everything from the database, so a duplicate
or replayed message is harmless (claim_job drops it).

Acknowledgement is early (task_acks_late=False) on purpose: crash safety comes from the job's
lease in the database (core.jobstates.requeue_expired), not from broker redelivery. With late
acks, Redis' visibility timeout would redeliver a training job that simply runs longer than the
timeout, and a killed worker's job would come back at a time we do not control.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery import Celery
from kombu import Queue

from core.settings import QUEUES

if TYPE_CHECKING:
    from core.settings import Settings

TRAIN_TASK = "fromscratch.train_job"


def make_celery(settings: Settings) -> Celery:
    app = Celery("fromscratch", broker=settings.broker_url, set_as_current=False)
    if settings.broker_url.startswith("sqla+"):
        # The SQL transport polls (default every 1 s). Its transport options all go to
        # create_engine(), so the interval is set on the transport class instead.
        from kombu.transport import sqlalchemy as kombu_sqla

        kombu_sqla.Transport.polling_interval = 0.25
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=False,
        worker_prefetch_multiplier=1,  # long tasks: never reserve a second job while training one
        broker_connection_retry_on_startup=True,
        # one routing table: the queue given at send time (job.queue) wins over this default
        task_queues=[Queue(name, routing_key=name) for name in QUEUES],
        task_default_queue=settings.default_queue,
        task_routes={TRAIN_TASK: {"queue": settings.default_queue}},
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
    )
    return app


def enqueue_job(celery: Celery, job_id: str, queue: str) -> None:
    """Send the training task for `job_id` to `queue`. Call only after the job row is committed."""
    if queue not in QUEUES:
        raise ValueError(f"unknown queue {queue!r}: use one of {QUEUES}")
    celery.send_task(TRAIN_TASK, args=[job_id], queue=queue)
