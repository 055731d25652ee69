"""Queues by device count (core/device_queues.py, issue 12): names, what a worker of D devices
consumes, and a routed job's message landing in its own queue on both transports."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from core.broker import TRAIN_TASK, enqueue_job, make_celery
from core.broker_queues import queued_job_ids
from core.device_queues import consumed_queues, job_queue, split_queue
from core.settings import MAX_DEVICES, Settings


def test_one_device_keeps_the_queues_of_before() -> None:
    assert job_queue("cpu", 1) == "cpu" and job_queue("gpu", 1) == "gpu"
    assert job_queue("gpu", 4) == "gpu.4"
    assert split_queue("gpu.4") == ("gpu", 4) and split_queue("cpu") == ("cpu", 1)
    for bad in ("inference", "gpu.1", "gpu.0", "gpu.04", "gpu.x", f"gpu.{MAX_DEVICES + 1}", "tpu.2"):
        assert split_queue(bad) is None, bad
    with pytest.raises(ValueError):
        job_queue("inference", 1)
    with pytest.raises(ValueError):
        job_queue("gpu", MAX_DEVICES + 1)


def test_a_worker_consumes_every_count_up_to_its_own() -> None:
    assert consumed_queues(["gpu"], 1) == ["gpu"]
    assert consumed_queues(["gpu"], 4) == ["gpu.4", "gpu.3", "gpu.2", "gpu"]
    assert consumed_queues(["cpu", "gpu"], 2) == ["cpu.2", "cpu", "gpu.2", "gpu"]
    assert consumed_queues(["inference"], 8) == ["inference"]
    # every queue a worker consumes routes back to a count it has
    for name in consumed_queues(["gpu"], 8):
        parsed = split_queue(name)
        assert parsed is not None and parsed[1] <= 8


@pytest.fixture(params=["redis", "sqla"])
def celery(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Celery]:
    if request.param == "redis":
        broker_url = request.getfixturevalue("throwaway_redis").url
    else:
        broker_url = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    app = make_celery(Settings(data_dir=tmp_path, database_url="", broker_url=broker_url))
    yield app
    app.close()


def test_a_multi_device_job_lands_in_its_own_queue(celery: Celery) -> None:
    enqueue_job(celery, "job-one", job_queue("gpu", 1))
    enqueue_job(celery, "job-four", job_queue("gpu", 4))
    enqueue_job(celery, "job-four-b", job_queue("gpu", 4), front=True)
    assert queued_job_ids(celery, TRAIN_TASK, ["gpu.4"]) == ["job-four-b", "job-four"]
    assert queued_job_ids(celery, TRAIN_TASK, ["gpu"]) == ["job-one"]
    # a two-device worker's queues hold none of the four-device jobs
    assert queued_job_ids(celery, TRAIN_TASK, consumed_queues(["gpu"], 2)) == ["job-one"]
    with pytest.raises(ValueError):
        enqueue_job(celery, "job-x", "gpu.1")
