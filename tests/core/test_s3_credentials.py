"""S3 credentials the server refuses are a setting to fix, said plainly wherever they are met: a
worker does not start (it would fail every job it took) and `fromscratch migrate` says it in one
line (the API's 503: tests/api/test_s3_credentials_api.py). A real SeaweedFS checks them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from core.blob_backends.s3 import S3Backend
from tests.fixtures.seaweedfs import SeaweedS3
from tests.fixtures.service import REPO_ROOT, fromscratch_cmd


def test_refused_credentials_and_a_missing_bucket_are_named(
    s3_env: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert S3Backend(s3_env.bucket, endpoint_url=s3_env.endpoint_url).unusable() is None
    missing = S3Backend("no-such-bucket-here", endpoint_url=s3_env.endpoint_url).unusable()
    assert missing == "the S3 bucket 'no-such-bucket-here' does not exist: run `fromscratch migrate` first"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    refused = S3Backend(s3_env.bucket, endpoint_url=s3_env.endpoint_url).unusable()
    assert refused is not None and refused.startswith("the S3 server refuses this process's credentials (")


def test_a_worker_with_refused_credentials_does_not_start_and_migrate_says_why(
    s3_env: SeaweedS3, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env.update(
        s3_env.env(),
        AWS_SECRET_ACCESS_KEY="not-the-secret",
        FROMSCRATCH_DATA_DIR=str(tmp_path),
        FROMSCRATCH_BLOB_BACKEND="s3",
        FROMSCRATCH_S3_ENDPOINT_URL=s3_env.endpoint_url,
        FROMSCRATCH_S3_BUCKET=s3_env.bucket,
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = fromscratch_cmd(*args)
        return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)

    migrate = run("migrate")  # the schema goes in, then the bucket's check is refused
    assert migrate.returncode == 2 and "Traceback" not in migrate.stderr, migrate.stderr
    assert "refuses these credentials for bucket" in migrate.stderr
    worker = run("worker", "--queues", "cpu")
    assert worker.returncode == 2, worker.stderr
    assert "fromscratch worker: the S3 server refuses this process's credentials" in worker.stderr
