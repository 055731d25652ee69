"""Through the openai SDK against a live server (uvicorn) and a real worker (PostgreSQL, Redis,
Celery): a succeeded job's results CSV matches its Metric rows; jobs.list filters by metadata; a
cancel answers `cancelled` at once and the worker stops (it lets go of the job and takes the next
one, and the cancelled job's metrics stay as they were); a pause reads `running` with
`pause_requested` until the worker has paused."""

from __future__ import annotations

import csv
import io
import secrets
from typing import Any

import openai
import pytest

from tests.fixtures.service import SHAKESPEARE, LiveServer, ServiceProcess, get_job, wait_until
from tests.worker.helpers import event_messages, metric_rows
from worker.result_file import HEADER

pytestmark = pytest.mark.service_settings(
    lease_seconds=5.0, heartbeat_seconds=1.0, reaper_interval_seconds=1.0
)
SHORT = {
    "max_steps": 12,
    "batch_size": 4,
    "ctx": 64,
    "eval_every": 6,
    "eval_batches": 2,
    "checkpoint_every": 0,
}
LONG = {"max_steps": 100_000, "batch_size": 2, "ctx": 32, "eval_every": 0, "checkpoint_every": 0}


def sdk_of(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)


def create(sdk: openai.OpenAI, file_id: str, hyperparameters: dict[str, Any], **extra: Any) -> Any:
    return sdk.fine_tuning.jobs.create(
        model="llama-tiny",
        training_file=file_id,
        hyperparameters=hyperparameters,  # type: ignore[arg-type]
        **extra,
    )


def wait_job(sdk: openai.OpenAI, job_id: str, done: Any, what: str, worker: ServiceProcess) -> Any:
    return wait_until(
        lambda: (j := sdk.fine_tuning.jobs.retrieve(job_id)) and done(j) and j,
        timeout=180,
        interval=0.3,
        message=lambda: f"{job_id} {what}\n{worker.output()}",
    )


def test_results_csv_and_metadata_filter(
    live_server: LiveServer, worker_proc: ServiceProcess, session_factory: Any
) -> None:
    sdk = sdk_of(live_server)
    f = sdk.files.create(file=("s.txt", SHAKESPEARE.read_bytes()), purpose="fine-tune")
    run = secrets.token_hex(4)
    job = create(sdk, f.id, SHORT, metadata={"suite": "results", "run": run})
    other = create(sdk, f.id, {**SHORT, "max_steps": 1}, metadata={"suite": "results", "run": "other"})
    done = wait_job(sdk, job.id, lambda j: j.status in ("succeeded", "failed"), "to finish", worker_proc)
    assert done.status == "succeeded", done.error

    assert len(done.result_files) == 1
    text = sdk.files.content(done.result_files[0]).text
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == HEADER
    stored = metric_rows(session_factory, job.id)
    assert [int(r[0]) for r in rows[1:]] == [m.step for m in stored] == list(range(1, 13))
    for r, m in zip(rows[1:], stored, strict=True):
        assert float(r[1]) == m.train_loss and float(r[5]) == m.lr and float(r[6]) == m.tokens_per_s
        assert (float(r[3]) if r[3] else None) == m.val_loss
    assert [int(r[0]) for r in rows[1:] if r[3]] == [6, 12]
    assert sdk.files.retrieve(done.result_files[0]).purpose == "fine-tune-results"

    assert [j.id for j in sdk.fine_tuning.jobs.list(metadata={"run": run})] == [job.id]
    both = [j.id for j in sdk.fine_tuning.jobs.list(metadata={"suite": "results"}, limit=1)]
    assert both == [other.id, job.id]  # newest first, one page at a time


def test_cancel_is_immediate_and_the_worker_stops_and_pause_reads_pending(
    live_server: LiveServer, worker_proc: ServiceProcess, session_factory: Any
) -> None:
    sdk = sdk_of(live_server)
    f = sdk.files.create(file=("s.txt", SHAKESPEARE.read_bytes()), purpose="fine-tune")
    first = create(sdk, f.id, LONG)
    wait_until(lambda: get_job(session_factory, first.id).step >= 3, timeout=120, message=worker_proc.output)

    answer = sdk.fine_tuning.jobs.cancel(first.id)
    assert answer.status == "cancelled" and answer.finished_at is not None
    assert sdk.fine_tuning.jobs.retrieve(first.id).status == "cancelled"
    # the worker notices between steps and lets go of the job
    wait_until(
        lambda: get_job(session_factory, first.id).lease_owner is None,
        timeout=60,
        message=lambda: f"the worker to let go of {first.id}\n{worker_proc.output()}",
    )
    assert "The worker stopped: the job was cancelled" in event_messages(session_factory, first.id)
    steps_then = [m.step for m in metric_rows(session_factory, first.id)]

    second = create(sdk, f.id, LONG)  # the one worker takes it: it has stopped training the first
    wait_until(lambda: get_job(session_factory, second.id).step >= 3, timeout=120, message=worker_proc.output)
    assert [m.step for m in metric_rows(session_factory, first.id)] == steps_then
    assert sdk.fine_tuning.jobs.retrieve(first.id).status == "cancelled"

    paused = sdk.fine_tuning.jobs.pause(second.id)
    assert paused.status == "running" and (paused.model_extra or {})["pause_requested"] is True
    done = wait_job(sdk, second.id, lambda j: j.status == "paused", "to pause", worker_proc)
    assert (done.model_extra or {})["pause_requested"] is False
    assert sdk.fine_tuning.jobs.cancel(second.id).status == "cancelled"
