"""The official `openai` SDK against the live server (`base_url=<server>/v1`) and a real worker:
upload, create (trainer options through `method.supervised.hyperparameters`), retrieve, list
(auto-paging over our cursor pagination), list_events, checkpoints.list, and cancel of a second,
longer job while it runs. Every answer must parse into the SDK's own types."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types import FileObject
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint

from tests.fixtures.service import SHAKESPEARE, LiveServer

TERMINAL = ("succeeded", "failed", "cancelled")
STEPS = 30
DEADLINE_S = 600.0


@pytest.fixture(scope="module")
def sdk(e2e_server: LiveServer) -> Iterator[openai.OpenAI]:
    # max_retries=0: a 5xx must fail the test, not be retried away
    client = openai.OpenAI(
        base_url=f"{e2e_server.url}/v1", api_key=e2e_server.api_key, max_retries=0, timeout=120.0
    )
    yield client
    client.close()


def wait_job(sdk: openai.OpenAI, job_id: str, done: Any, what: str, logs: Any) -> FineTuningJob:
    deadline = time.monotonic() + DEADLINE_S
    job = sdk.fine_tuning.jobs.retrieve(job_id)
    while not done(job):
        if job.status in TERMINAL:
            pytest.fail(f"job {job_id} ended {job.status} ({job.error}) while waiting for {what}\n{logs()}")
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} not {what} after {DEADLINE_S:.0f}s (status {job.status})\n{logs()}")
        time.sleep(0.5)
        job = sdk.fine_tuning.jobs.retrieve(job_id)
    return job


@pytest.fixture(scope="module")
def training_file(sdk: openai.OpenAI) -> FileObject:
    with open(SHAKESPEARE, "rb") as fh:
        f = sdk.files.create(file=fh, purpose="fine-tune")
    assert isinstance(f, FileObject)
    assert f.id.startswith("file-") and f.bytes == SHAKESPEARE.stat().st_size
    assert f.purpose == "fine-tune" and f.filename == SHAKESPEARE.name
    assert sdk.files.retrieve(f.id).id == f.id
    return f


def test_sdk_train_retrieve_list_events_checkpoints(
    sdk: openai.OpenAI, training_file: FileObject, service_logs: Any
) -> None:
    hp = {
        "batch_size": 8,
        "learning_rate_multiplier": 3.0,
        "max_steps": STEPS,
        "ctx": 64,
        "eval_every": 10,
        "eval_batches": 2,
        "checkpoint_every": 10,
        "keep_checkpoints": 5,
    }
    job = sdk.fine_tuning.jobs.create(
        model="llama-tiny",
        training_file=training_file.id,
        seed=7,
        suffix="sdk",
        metadata={"run": "sdk"},
        method={"type": "supervised", "supervised": {"hyperparameters": hp}},
    )  # type: ignore[typeddict-unknown-key]
    assert isinstance(job, FineTuningJob)
    assert job.status in ("validating_files", "queued") and job.model == "llama-tiny"
    assert job.training_file == training_file.id and job.seed == 7 and job.metadata == {"run": "sdk"}
    assert job.fine_tuned_model is None
    assert job.hyperparameters.batch_size == 8 and job.hyperparameters.learning_rate_multiplier == 3.0
    assert job.method is not None and job.method.type == "supervised"

    done = wait_job(sdk, job.id, lambda j: j.status == "succeeded", "succeeded", service_logs)
    assert isinstance(done, FineTuningJob)
    assert done.fine_tuned_model is not None and done.fine_tuned_model.startswith("ft:llama-tiny:sdk:")
    assert done.trained_tokens is not None and done.trained_tokens > 0
    assert done.finished_at is not None and done.finished_at >= done.created_at
    assert done.error is None
    assert (done.model_extra or {}).get("progress", {}).get("step") == STEPS  # our extension passes through

    listed = sdk.fine_tuning.jobs.list(limit=10)
    assert all(isinstance(j, FineTuningJob) for j in listed.data)
    assert [j for j in listed.data if j.id == job.id][0].status == "succeeded"

    # events: newest first; lifecycle messages and one metrics event per logged step
    events = sdk.fine_tuning.jobs.list_events(job.id, limit=200).data
    assert events and all(isinstance(e, FineTuningJobEvent) for e in events)
    assert [e.created_at for e in events] == sorted((e.created_at for e in events), reverse=True)
    metrics = [e for e in events if e.type == "metrics"]
    steps = [e.data["step"] for e in metrics]  # type: ignore[index]
    assert sorted(steps) == list(range(1, STEPS + 1)) and steps[0] == STEPS
    assert all(math.isfinite(e.data["train_loss"]) for e in metrics)  # type: ignore[index]
    assert any(e.data.get("valid_loss") is not None for e in metrics)  # type: ignore[union-attr]
    messages = [e.message for e in events if e.type == "message"]
    assert any("succeeded" in m for m in messages), messages
    # the SDK's cursor pagination walks the same events, a few at a time
    paged = [e.id for e in sdk.fine_tuning.jobs.list_events(job.id, limit=7)]
    assert paged == [e.id for e in events]

    ckpts = list(sdk.fine_tuning.jobs.checkpoints.list(job.id, limit=2))  # auto-paging, 2 per page
    assert all(isinstance(c, FineTuningJobCheckpoint) for c in ckpts)
    assert [c.step_number for c in ckpts] == [30, 20, 10]
    for c in ckpts:
        assert c.fine_tuning_job_id == job.id
        assert c.fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-{c.step_number}"
        assert c.metrics.step == c.step_number
        assert c.metrics.train_loss is not None and math.isfinite(c.metrics.train_loss)

    model = sdk.models.retrieve(done.fine_tuned_model)
    assert model.id == done.fine_tuned_model and model.object == "model"
    assert done.fine_tuned_model in [m.id for m in sdk.models.list()]


def test_sdk_cancel_a_running_job(sdk: openai.OpenAI, training_file: FileObject, service_logs: Any) -> None:
    # 3 epochs of ~2800 windows of 32 bytes, 4 per step: ~2100 steps, long enough to cancel mid-run
    job = sdk.fine_tuning.jobs.create(
        model="llama-tiny",
        training_file=training_file.id,
        seed=3,
        hyperparameters={
            "n_epochs": 3,
            "batch_size": 4,
            "ctx": 32,
            "eval_every": 0,  # type: ignore[typeddict-unknown-key]
            "checkpoint_every": 0,
        },
    )
    assert job.hyperparameters.n_epochs == 3
    running = wait_job(
        sdk,
        job.id,
        lambda j: j.status == "running" and ((j.model_extra or {}).get("progress") or {}).get("step"),
        "running with a step done",
        service_logs,
    )
    total = running.model_extra["progress"]["total_steps"]  # type: ignore[index]
    assert total > 1000

    answer = sdk.fine_tuning.jobs.cancel(job.id)
    assert isinstance(answer, FineTuningJob) and answer.id == job.id
    assert answer.status in ("running", "cancelled")
    cancelled = wait_job(sdk, job.id, lambda j: j.status == "cancelled", "cancelled", service_logs)
    assert cancelled.fine_tuned_model is None and cancelled.finished_at is not None
    assert cancelled.model_extra["progress"]["step"] < total  # type: ignore[index]

    # cancelling again is harmless; the job list pages through both jobs with limit=1
    assert sdk.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    ids = [j.id for j in sdk.fine_tuning.jobs.list(limit=1)]
    assert ids[0] == job.id and len(ids) == len(set(ids)) >= 2
    messages = [
        e.message for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100).data if e.type == "message"
    ]
    assert any("cancel" in m.lower() for m in messages), messages
