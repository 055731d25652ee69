"""POST /v1/fine_tuning/jobs/estimate: the new-job form's live estimate. Its numbers are admission's
own (api.job_limits.job_size), a job too large comes back with the same words a create would answer
(beside the numbers, not as a 400), other bad requests are the create's 400s, nothing is written,
and the time is the request's compute over what this worker class achieved on finished jobs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.job_estimate import RATE_JOBS
from api.job_limits import job_size
from core.db import make_engine, make_session_factory
from core.models import Job
from core.settings import Settings
from tests.api.conftest import SHAKESPEARE, Factory, Tenant, count, upload
from tests.api.test_errors import assert_envelope
from trainer.config import TrainConfig, model_config_from_preset
from trainer.config.estimate import max_windows_per_epoch, total_steps
from trainer.data.prepare import prepare_data
from trainer.data.tokenizers import ByteTokenizer

URL = "/v1/fine_tuning/jobs/estimate"


# The time is a median over a worker class's finished jobs in the whole table, so what these tests
# assert of it depends on every job the table holds: each test gets a database of its own (the
# session's database holds other tests' finished jobs, in an order that depends on the run).
@pytest.fixture
def pg_url(pg_database_factory: Callable[..., str]) -> str:
    return pg_database_factory()


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


def uploaded(client: TestClient, tenant: Tenant) -> dict[str, Any]:
    r = upload(client, tenant, SHAKESPEARE.read_bytes(), "shakespeare.txt")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_estimate_is_admissions_arithmetic(
    client: TestClient, tenant: Tenant, session_factory: Any, settings: Settings
) -> None:
    f = uploaded(client, tenant)
    body = {
        "model": "llama-tiny",
        "training_file": f["id"],
        "hyperparameters": {"max_steps": 300, "device": "cpu"},
    }
    r = client.post(URL, headers=tenant.headers, json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    model_cfg = model_config_from_preset("llama-tiny")
    train_cfg = TrainConfig(max_steps=300, device="cpu")
    size = job_size(model_cfg, train_cfg, "cpu", f["bytes"], False)
    assert got["object"] == "fine_tuning.job.estimate" and got["queue"] == "cpu" and got["device"] == "cpu"
    assert got["steps"] == 300 == size.steps
    # auto eval_every: 20 evaluations of 300 steps (every 15th), eval_batches 20 x batch_size x ctx each
    assert got["eval_tokens"] == size.eval_tokens == 20 * 20 * train_cfg.batch_size * model_cfg.ctx
    assert got["tokens"] == size.tokens == 300 * got["tokens_per_step"]
    assert got["memory_bytes"] == size.memory.total > 0
    assert got["memory_limit_bytes"] == settings.cpu_worker_memory_bytes
    assert got["parameters"] > 0 and got["problem"] is None
    assert got["seconds"] is None and got["rate_jobs"] == 0  # no job of this class has finished
    assert count(session_factory, Job, Job.owner_id == tenant.owner_id) == 0  # nothing written


def test_a_job_too_large_comes_with_its_numbers(client: TestClient, tenant: Tenant) -> None:
    f = uploaded(client, tenant)
    big = {"n_layer": 256, "n_embd": 768, "n_head": 12, "device": "cpu"}
    body = {"model": "llama-tiny", "training_file": f["id"], "hyperparameters": big}
    got = client.post(URL, headers=tenant.headers, json=body).json()
    create = assert_envelope(client.post("/v1/fine_tuning/jobs", headers=tenant.headers, json=body), 400)
    assert (
        got["problem"] == {"message": create["message"], "param": create["param"]}
        and create["param"] == "n_embd"
    )
    assert got["memory_bytes"] > got["memory_limit_bytes"]


def test_other_bad_requests_are_the_creates_400s(client: TestClient, tenant: Tenant) -> None:
    f = uploaded(client, tenant)
    err = assert_envelope(
        client.post(URL, headers=tenant.headers, json={"model": "llama-tiny", "training_file": "file-nope"}),
        400,
    )
    assert err["param"] == "training_file"
    bad = {"model": "llama-tiny", "training_file": f["id"], "hyperparameters": {"n_embd": 65}}
    assert assert_envelope(client.post(URL, headers=tenant.headers, json=bad), 400)["param"] == "n_embd"
    assert client.post(URL, json=bad).status_code == 401


def test_the_time_comes_from_finished_jobs_of_the_worker_class(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    # the newest finished jobs of the class (RATE_JOBS of them, so the median is theirs): llama-tiny
    # cpu jobs that each trained 1,000,000 tokens in 100 s
    started = datetime.now(UTC)
    for _ in range(RATE_JOBS):
        factory.job(
            tenant.owner_id,
            status="succeeded",
            queue="cpu",
            trained_tokens=1_000_000,
            started_at=started,
            finished_at=started + timedelta(seconds=100),
        )
    f = uploaded(client, tenant)
    body = {
        "model": "llama-tiny",
        "training_file": f["id"],
        "hyperparameters": {"max_steps": 300, "device": "cpu"},
    }
    got = client.post(URL, headers=tenant.headers, json=body).json()
    # the same model: its tokens at the measured 10,000 tokens/s, a validation token a third of one
    assert got["rate_jobs"] == RATE_JOBS and got["eval_tokens"] > 0
    assert got["seconds"] == round((got["tokens"] + got["eval_tokens"] / 3) / 10_000, 1)
    # a gpu job's class has its own rate (none measured here)
    gpu = {**body, "hyperparameters": {"max_steps": 300, "device": "cuda"}}
    assert client.post(URL, headers=tenant.headers, json=gpu).json()["seconds"] is None


def test_a_chat_file_is_sized_by_its_text_not_its_json(
    client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    """A JSONL upload is sized by the tokens its records render to (measured at upload), so an
    n_epochs job's steps are the trainer's own for the byte tokenizer, not twice as many from its
    JSON's bytes."""
    turns = [
        {
            "messages": [
                {"role": "user", "content": f"Question {i}?"},
                {"role": "assistant", "content": f"Answer {i}."},
            ]
        }
        for i in range(300)
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    r = upload(client, tenant, path.read_bytes(), "chat.jsonl")
    assert r.status_code == 200, r.text
    hyperparameters = {"n_epochs": 1, "ctx": 64, "batch_size": 4, "device": "cpu"}
    body = {"model": "llama-tiny", "training_file": r.json()["id"], "hyperparameters": hyperparameters}
    got = client.post(URL, headers=tenant.headers, json=body).json()
    train_cfg = TrainConfig(n_epochs=1, batch_size=4, device="cpu")
    trained = len(prepare_data(path, ByteTokenizer(), val_fraction=train_cfg.val_fraction).train)
    windows = max_windows_per_epoch(trained, 64, train_cfg.samples_after_nl)
    assert got["steps"] == total_steps(train_cfg, windows) > 0
    by_bytes = job_size(
        model_config_from_preset("llama-tiny", ctx=64), train_cfg, "cpu", r.json()["bytes"], False
    )
    assert got["steps"] < 0.6 * by_bytes.steps
