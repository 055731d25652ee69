"""Cancel and pause while the S3 server is down and a checkpoint upload retries through the outage
(this test's own SeaweedFS, killed by PID; `db_retry_seconds` far longer than any wait here).

A cancel takes effect without storage coming back: the worker abandons the upload
(worker.checkpoint_uploads), the job stays `cancelled` and the worker lets go of it while the
server is still down, then takes the next job once it is back. A pause is no cancel: its resume
needs its checkpoint, so it waits for the server and ends `paused` with its step's checkpoint
stored whole."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from core.jobstates import request_cancel, request_pause
from core.models import Blob, Job
from core.settings import Settings
from tests.fixtures.seaweedfs import SeaweedS3, on_s3
from tests.fixtures.service import ServiceProcess, get_job, make_job, wait_for_status, wait_until
from tests.worker.helpers import checkpoint_rows, event_messages

# a checkpoint every 5 steps: with the server down, training soon waits on the upload in flight
RUN = dict(max_steps=100_000, batch_size=4, checkpoint_every=5, eval_every=0, warmup_steps=1)


@pytest.fixture
def settings(settings: Settings, own_s3: SeaweedS3) -> Settings:
    # an hour: a worker that waited out the upload's retries would hold the job past every wait below
    return on_s3(settings, own_s3, "stop-outage/", db_retry_seconds=3600.0)


def _ask(session_factory: Any, job_id: str, action: Any) -> None:
    """What the API's /cancel and /pause routes do."""
    with session_factory() as session:
        action(session, session.get(Job, job_id))
        session.commit()


def _upload_meets_outage(
    session_factory: Any, job_id: str, worker: ServiceProcess, server: SeaweedS3
) -> None:
    """A checkpoint stored, then the server killed, until an upload has failed and retries."""
    wait_until(
        lambda: checkpoint_rows(session_factory, job_id),
        timeout=180,
        message=lambda: f"a stored checkpoint\n{worker.output()}",
    )
    server.stop()  # SIGKILL, by PID
    wait_until(
        lambda: "blob store unreachable: checkpoint uploads" in worker.output(tail=200_000),
        timeout=120,
        message=lambda: f"an upload retrying through the outage\n{worker.output()}",
    )


def test_a_cancel_does_not_wait_for_storage_to_come_back(
    settings: Settings, session_factory: Any, worker_proc: ServiceProcess, own_s3: SeaweedS3
) -> None:
    job_id = make_job(settings, session_factory, owner_id="owner-s3-cancel", train=RUN)
    _upload_meets_outage(session_factory, job_id, worker_proc, own_s3)
    _ask(session_factory, job_id, request_cancel)
    job: Any = wait_until(
        lambda: (j := get_job(session_factory, job_id)).lease_owner is None and j,
        timeout=120,
        message=lambda: f"the worker to let go of {job_id} with the server down\n{worker_proc.output()}",
    )
    assert job.status == "cancelled" and job.fine_tuned_model is None
    assert own_s3.process is not None and own_s3.process.poll() is not None  # still down
    log = worker_proc.output(tail=200_000)
    assert "checkpoint upload from" in log and "abandoned" in log, log[-6000:]
    assert not any("unreachable for too long" in m for m in event_messages(session_factory, job_id))

    own_s3.start()  # the same ports and data: the worker is free for the next job
    nxt = make_job(settings, session_factory, owner_id="owner-s3-cancel", train={**RUN, "max_steps": 20})
    wait_for_status(session_factory, nxt, "succeeded", timeout=300, diagnostics=worker_proc.output)


def test_a_pause_in_the_outage_waits_to_store_its_checkpoint(
    settings: Settings, session_factory: Any, worker_proc: ServiceProcess, own_s3: SeaweedS3
) -> None:
    job_id = make_job(settings, session_factory, owner_id="owner-s3-pause", train=RUN)
    _upload_meets_outage(session_factory, job_id, worker_proc, own_s3)
    _ask(session_factory, job_id, request_pause)
    own_s3.start()
    paused = wait_for_status(session_factory, job_id, "paused", timeout=300, diagnostics=worker_proc.output)
    assert paused.lease_owner is None
    newest = checkpoint_rows(session_factory, job_id)[-1]
    assert newest.step == paused.step and newest.optimizer_blob_id is not None  # what a resume needs
    client = own_s3.client()
    with session_factory() as session:
        for blob_id in (newest.blob_id, newest.optimizer_blob_id):
            blob = session.scalar(select(Blob).where(Blob.id == blob_id))
            assert blob is not None and blob.complete
            assert client.head_object(Bucket=own_s3.bucket, Key=blob.path)["ContentLength"] == blob.size
