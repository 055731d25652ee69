"""The S3 server killed for 20 s while a job uploads its checkpoints (issue 22): the upload in flight
retries through the outage (worker.checkpoint_uploads), training waits at the next checkpoint instead
of failing, and the job succeeds once the server is back. Every checkpoint the job lists is whole:
its objects exist with the sizes their rows record. The server is this test's own SeaweedFS, on its
own ports, killed by PID and restarted on the same data."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import select

from core.models import Blob, Checkpoint
from core.settings import Settings
from tests.fixtures.seaweedfs import SeaweedS3, on_s3
from tests.fixtures.service import ServiceProcess, make_job, wait_for_status, wait_until
from tests.worker.helpers import checkpoint_rows, event_messages

OUTAGE_SECONDS = 20.0
# a checkpoint every 5 steps keeps an upload in flight most of the time, so the kill lands mid-upload
RUN = dict(max_steps=300, batch_size=4, checkpoint_every=5, eval_every=0, warmup_steps=1)


@pytest.fixture
def settings(settings: Settings, own_s3: SeaweedS3) -> Settings:
    return on_s3(settings, own_s3, "outage/", db_retry_seconds=90.0)


def _whole(session_factory: Any, server: SeaweedS3, job_id: str) -> list[int]:
    """The steps of the job's checkpoints, each checked whole: complete rows, objects of their size."""
    client = server.client()
    with session_factory() as s:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).all()
        for row in rows:
            for blob_id in filter(None, (row.blob_id, row.optimizer_blob_id)):
                blob = s.get(Blob, blob_id)
                assert blob is not None and blob.complete and blob.backend == "s3", blob_id
                head = client.head_object(Bucket=server.bucket, Key=blob.path)
                assert head["ContentLength"] == blob.size, (row.step, blob_id)
        return sorted(row.step for row in rows)


def test_a_job_survives_the_s3_server_down_for_20_s_mid_upload(
    settings: Settings, session_factory: Any, worker_proc: ServiceProcess, own_s3: SeaweedS3
) -> None:
    job_id = make_job(settings, session_factory, owner_id="owner-s3-outage", train=RUN)
    wait_until(
        lambda: len(checkpoint_rows(session_factory, job_id)) >= 2, timeout=120, message="two checkpoints"
    )
    own_s3.stop()  # SIGKILL, by PID
    killed_at = time.monotonic()
    wait_until(
        lambda: "blob store unreachable" in worker_proc.output(tail=200_000),
        timeout=60,
        message="the worker meeting the outage",
    )
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - killed_at)))
    own_s3.start()  # the same ports and data

    wait_for_status(session_factory, job_id, "succeeded", timeout=300, diagnostics=worker_proc.output)
    assert "was unreachable for too long" not in " ".join(event_messages(session_factory, job_id))
    steps = _whole(session_factory, own_s3, job_id)
    assert steps and steps[-1] == RUN["max_steps"]
    # only the newest step checkpoint would keep optimizer state, and a finished job keeps none
    assert all(c.optimizer_blob_id is None for c in checkpoint_rows(session_factory, job_id))
