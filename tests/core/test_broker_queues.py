"""Reading and reordering the broker's queues (core/broker_queues.py), on both transports the
service runs on: a Redis server of the test's own and kombu's SQL transport on SQLite. Messages are
taken the way a worker takes them (kombu's `basic_get`), so "head" means what a worker gets next."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from core.broker import TRAIN_TASK, enqueue_job, make_celery
from core.broker_queues import move_to_head, queued_job_ids
from core.settings import Settings


@pytest.fixture(params=["redis", "sqla"])
def celery(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Celery]:
    if request.param == "redis":
        broker_url = request.getfixturevalue("throwaway_redis").url
    else:
        broker_url = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    app = make_celery(Settings(data_dir=tmp_path, database_url="", broker_url=broker_url))
    yield app
    app.close()


def take_all(app: Celery, queue: str = "cpu") -> list[str]:
    """Job ids in the order workers would take them (consumes the queue)."""
    import json

    from kombu.utils.encoding import bytes_to_str

    taken = []
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            args, _, _ = json.loads(bytes_to_str(message.body))
            taken.append(args[0])
    return taken


def test_queued_job_ids_lists_the_head_first(celery: Celery) -> None:
    for job_id in ("job-a", "job-b", "job-c"):
        enqueue_job(celery, job_id, "cpu")
    enqueue_job(celery, "job-gpu", "gpu")
    assert queued_job_ids(celery, TRAIN_TASK, ["cpu"]) == ["job-a", "job-b", "job-c"]
    assert queued_job_ids(celery, TRAIN_TASK, ["gpu"]) == ["job-gpu"]
    assert queued_job_ids(celery, "some.other_task", ["cpu"]) == []
    assert take_all(celery) == ["job-a", "job-b", "job-c"]
    assert queued_job_ids(celery, TRAIN_TASK, ["cpu"]) == []  # taken messages are no longer waiting


def test_a_job_sent_to_the_front_is_taken_next(celery: Celery) -> None:
    for job_id in ("job-a", "job-b", "job-c"):
        enqueue_job(celery, job_id, "cpu")
    enqueue_job(celery, "job-requeued", "cpu", front=True)
    assert queued_job_ids(celery, TRAIN_TASK, ["cpu"])[0] == "job-requeued"
    assert take_all(celery) == ["job-requeued", "job-a", "job-b", "job-c"]


def test_the_last_one_sent_to_the_front_is_taken_first(celery: Celery) -> None:
    enqueue_job(celery, "job-new", "cpu")
    enqueue_job(celery, "job-second", "cpu", front=True)
    enqueue_job(celery, "job-first", "cpu", front=True)
    assert take_all(celery) == ["job-first", "job-second", "job-new"]


def test_moving_a_message_no_longer_waiting_is_a_no_op(celery: Celery) -> None:
    enqueue_job(celery, "job-a", "cpu")
    assert take_all(celery) == ["job-a"]
    assert move_to_head(celery, "cpu", "no-such-task-id") is False
