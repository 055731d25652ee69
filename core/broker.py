"""Celery wiring shared by the API (sends) and the worker (consumes).

The message carries only a job id; the task re-reads everything from the database, so a duplicate
or replayed message is harmless (claim_job drops it).

Acknowledgement is early (task_acks_late=False) on purpose: crash safety comes from the job's
lease in the database (core.jobstates.requeue_expired), not from broker redelivery. With late
acks, Redis' visibility timeout would redeliver a training job that simply runs longer than the
timeout, and a killed worker's job would come back at a time we do not control.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from celery import Celery
from kombu import Queue

from core.broker_faults import describe
from core.broker_queues import move_to_head
from core.device_queues import job_queue, split_queue
from core.settings import INFERENCE_QUEUE, QUEUES, WORKER_QUEUES

if TYPE_CHECKING:
    from core.settings import Settings

TRAIN_TASK = "fromscratch.train_job"
EXPORT_TASK = "fromscratch.export_model"  # args: [export id] (an `exports` row, status preparing)
INFERENCE_TASK = "fromscratch.inference"  # args: [inference request id]
log = logging.getLogger(__name__)


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
        # a worker outlives any broker outage (Celery's default gives up after 100 reconnect tries)
        broker_connection_max_retries=None,
        # acts only on late-ack tasks (ours ack early); set, it also stops Celery's deprecation warning
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_enable_prefetch_count_reduction=False,  # nothing to reduce: the prefetch is 1
        # one routing table: the queue given at send time (job.queue) wins over this default.
        # Queues routed by device count (`gpu.4`, core/device_queues.py) are not listed: Celery
        # declares them the same way on first send or consume (task_create_missing_queues).
        task_queues=[Queue(name, routing_key=name) for name in WORKER_QUEUES],
        task_default_queue=settings.default_queue,
        task_routes={
            TRAIN_TASK: {"queue": settings.default_queue},
            EXPORT_TASK: {"queue": INFERENCE_QUEUE},
            INFERENCE_TASK: {"queue": INFERENCE_QUEUE},
        },
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
    )
    return app


def prepare_broker(settings: Settings) -> None:
    """Create the SQL transport's tables and queue rows (the embedded `sqla+sqlite://` broker) before
    any process uses it; `fromscratch serve` calls it before it starts the API and the workers.

    Left to them, every process creates the tables on its first use (kombu's `metadata.create_all`)
    and each queue's row on its first send or consume, check then insert: two processes doing it
    at once meet "table already exists" or a duplicate queue row, and kombu's retry after that
    error publishes on the channel it just closed (AttributeError). Created first, each process
    only finds them. Queues: every one a worker consumes or the API routes a job to (the training
    queues up to the devices the API admits, `<queue>.<N>`). Other brokers (Redis) need nothing."""
    if not settings.broker_url.startswith("sqla+"):
        return
    names = [INFERENCE_QUEUE, *QUEUES]
    for queue, devices in (("cpu", settings.cpu_worker_devices), ("gpu", settings.gpu_worker_devices)):
        names += [job_queue(queue, n) for n in range(2, devices + 1)]
    with make_celery(settings).connection_for_write() as conn:
        channel = conn.default_channel  # the first use: kombu creates its tables
        for name in names:
            Queue(name, routing_key=name)(channel).declare()


def enqueue_job(celery: Celery, job_id: str, queue: str, *, front: bool = False) -> None:
    """Send the training task for `job_id` to `queue`. Call only after the job row is committed.

    `front=True` for a job that goes back to the queue (its worker shut down or was lost, or its
    message was lost): the job had its turn already, so its message goes to the head of the queue
    instead of behind every job sent since (core/broker_queues.py). Sending several, the last one
    sent is taken first. Should the move fail, the message stays where it was sent: late, not lost."""
    if split_queue(queue) is None:  # `cpu`, `gpu`, or one routed by device count (`gpu.4`)
        raise ValueError(f"unknown queue {queue!r}: use one of {QUEUES}, or <queue>.<devices>")
    task_id = str(uuid.uuid4())
    celery.send_task(TRAIN_TASK, args=[job_id], queue=queue, task_id=task_id)
    if front:
        try:
            move_to_head(celery, queue, task_id)
        except Exception as exc:  # sent already; its place is a nicety
            log.warning("job %s: sent, but not moved to the head of %s (%s)", job_id, queue, describe(exc))


def send_to_inference_worker(celery: Celery, task_name: str, row_id: str) -> None:
    """Send an export or inference task (EXPORT_TASK / INFERENCE_TASK) for the row `row_id` to the
    inference queue. Call only after the row is committed; raises when the broker is unreachable."""
    if task_name not in (EXPORT_TASK, INFERENCE_TASK):
        raise ValueError(f"{task_name!r} is not a task of the {INFERENCE_QUEUE} queue")
    celery.send_task(task_name, args=[row_id], queue=INFERENCE_QUEUE)
