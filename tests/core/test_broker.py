"""The message reaches the queue the job names, carrying only the job id, as JSON."""

import base64
import json

import redis

from core.broker import TRAIN_TASK, enqueue_job, make_celery
from core.settings import Settings


def test_enqueue_routes_to_the_named_queue(settings: Settings, redis_url: str) -> None:
    celery = make_celery(settings)
    client = redis.Redis.from_url(redis_url)
    client.delete("cpu", "gpu")
    try:
        enqueue_job(celery, "ftjob-aaa", "gpu")
        enqueue_job(celery, "ftjob-bbb", "cpu")
        assert client.llen("gpu") == 1 and client.llen("cpu") == 1
        message = json.loads(client.lpop("gpu"))
        assert message["content-type"] == "application/json"
        assert message["headers"]["task"] == TRAIN_TASK
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert (args, kwargs) == (["ftjob-aaa"], {})
    finally:
        client.delete("cpu", "gpu")
        client.close()
        celery.close()


def test_config_is_json_only_prefetch_one_early_ack(settings: Settings) -> None:
    conf = make_celery(settings).conf
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.worker_prefetch_multiplier == 1 and conf.task_acks_late is False
    assert {q.name for q in conf.task_queues} == {"cpu", "gpu", "inference"}  # routed gpu.N: created on use
