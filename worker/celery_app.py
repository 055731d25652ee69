"""The worker's Celery application.

`app` is built from the same settings every other part reads (`FROMSCRATCH_*`), via
`core.broker.make_celery` (JSON only, prefetch 1, acks early, one routing table). The task module is
listed in `imports`, so `celery -A worker.celery_app:app worker` (what `fromscratch worker` runs)
registers `fromscratch.train_job` without a circular import. The reaper thread starts when the
worker is ready (see worker/reaper.py); a broker outage is logged as two lines, not one a
reconnect try (worker/broker_log.py).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, signals

from core.broker import enqueue_job as _enqueue_job
from core.broker import make_celery
from core.settings import get_settings

app: Celery = make_celery(get_settings())
app.conf.imports = ("worker.tasks",)


def enqueue_job(job_id: str, queue: str, *, front: bool = False) -> None:
    """Send `fromscratch.train_job(job_id)` to `queue` (to its head with `front`: a job going back
    to the queue). Call only after the job row is committed."""
    _enqueue_job(app, job_id, queue, front=front)


@signals.worker_init.connect
def _quiet_broker_outages(sender: object = None, **_: Any) -> None:
    from worker.broker_log import install_outage_filter

    install_outage_filter()


@signals.worker_ready.connect
def _start_reaper(sender: object = None, **_: Any) -> None:
    from worker.reaper import start_reaper

    start_reaper(app, get_settings())


@signals.worker_shutting_down.connect
def _on_shutting_down(sig: str | None = None, how: str | None = None, **_: Any) -> None:
    # Runs inside the signal handler: only set a flag. The running job checkpoints, gives its lease
    # back and is re-queued (worker/job_ending.py) instead of making the shutdown wait for a long run.
    from worker.process import request_shutdown

    request_shutdown()
