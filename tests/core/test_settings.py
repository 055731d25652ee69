import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import Settings, get_settings, reset_settings
from tests.fixtures.service import env_from_settings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("FROMSCRATCH_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_derive_from_data_dir(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("FROMSCRATCH_DATA_DIR", str(tmp_path / "d"))
    s = Settings()
    d = (tmp_path / "d").resolve()
    assert s.data_dir == d
    assert s.database_url == f"sqlite:///{d}/fromscratch.db"
    assert s.broker_url == f"sqla+sqlite:///{d}/broker.db"
    assert s.blob_dir == d / "blobs"
    assert s.work_dir == d / "work"
    # the embedded install keeps blobs as files in the data dir, not in SQLite
    assert (s.blob_backend, s.max_upload_bytes, s.lease_seconds, s.max_attempts) == ("fs", 1 << 30, 30, 3)
    assert s.queues == ["cpu"] and s.default_queue == "cpu"
    assert (s.s3_bucket, s.s3_endpoint_url, s.s3_prefix, s.s3_presigned_downloads) == ("", "", "", False)


def test_blob_backend_default_follows_the_database(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Files on SQLite (one machine); database rows on PostgreSQL, where workers may run on other
    machines and share nothing but the database. An explicit choice always wins."""
    assert Settings(data_dir=tmp_path).blob_backend == "fs"
    postgres = "postgresql+psycopg://u@db:5432/x"
    assert Settings(data_dir=tmp_path, database_url=postgres).blob_backend == "db"
    assert Settings(data_dir=tmp_path, database_url=postgres, blob_backend="fs").blob_backend == "fs"
    clean_env.setenv("FROMSCRATCH_BLOB_BACKEND", "db")
    assert Settings(data_dir=tmp_path).blob_backend == "db"


def test_s3_settings_from_the_environment(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = {
        "BLOB_BACKEND": "s3",
        "S3_ENDPOINT_URL": "http://seaweedfs:8333",
        "S3_BUCKET": "models",
        "S3_PREFIX": "prod/",
        "S3_PRESIGNED_DOWNLOADS": "true",
        "S3_PUBLIC_ENDPOINT_URL": "https://s3.example.org",
    }
    for k, v in env.items():
        clean_env.setenv(f"FROMSCRATCH_{k}", v)
    s = Settings(data_dir=tmp_path)
    assert (s.blob_backend, s.s3_endpoint_url, s.s3_bucket, s.s3_prefix) == (
        "s3",
        "http://seaweedfs:8333",
        "models",
        "prod/",
    )
    assert s.s3_presigned_downloads is True and s.s3_public_endpoint_url == "https://s3.example.org"
    clean_env.delenv("FROMSCRATCH_S3_BUCKET")
    with pytest.raises(ValidationError, match="s3_bucket"):
        Settings(data_dir=tmp_path)


def test_env_vars_override_every_field(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = {
        "DATABASE_URL": "postgresql+psycopg://u:p%40ss@db:5432/x",
        "BROKER_URL": "redis://redis:6379/0",
        "BLOB_BACKEND": "fs",
        "BLOB_DIR": str(tmp_path / "b"),
        "MAX_UPLOAD_BYTES": "1000",
        "LEASE_SECONDS": "10",
        "HEARTBEAT_SECONDS": "2",
        "MAX_ATTEMPTS": "5",
        "WORKER_QUEUES": "gpu,cpu",
        "DEFAULT_QUEUE": "gpu",
        "DEVICE": "cuda",
    }
    for k, v in env.items():
        clean_env.setenv(f"FROMSCRATCH_{k}", v)
    s = Settings()
    assert s.database_url == env["DATABASE_URL"]
    assert s.broker_url == env["BROKER_URL"]
    assert s.blob_backend == "fs" and s.blob_dir == (tmp_path / "b").resolve()
    assert (s.max_upload_bytes, s.lease_seconds, s.heartbeat_seconds, s.max_attempts) == (1000, 10, 2, 5)
    assert s.queues == ["gpu", "cpu"] and s.default_queue == "gpu"
    assert s.device == "cuda"


def test_relative_sqlite_urls_become_absolute(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.chdir(tmp_path)
    s = Settings(database_url="sqlite:///rel/x.db", broker_url="sqla+sqlite:///b.db")
    assert s.database_url == f"sqlite:///{tmp_path.resolve()}/rel/x.db"
    assert s.broker_url == f"sqla+sqlite:///{tmp_path.resolve()}/b.db"


def test_invalid_values_are_rejected(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="worker_queues"):
        Settings(worker_queues="cpu,tpu")
    with pytest.raises(ValidationError, match="heartbeat_seconds"):
        Settings(lease_seconds=2, heartbeat_seconds=5)
    with pytest.raises(ValidationError):
        Settings(blob_backend="nfs")
    with pytest.raises(ValidationError, match="s3_bucket"):
        Settings(blob_backend="s3")


def test_the_child_process_environment_round_trips(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, lease_seconds=3, heartbeat_seconds=1, worker_queues="cpu,gpu")
    for k, v in env_from_settings(s).items():
        if k.startswith("FROMSCRATCH_"):
            clean_env.setenv(k, v)
    assert Settings() == s


def test_get_settings_is_cached_until_reset(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("FROMSCRATCH_DATA_DIR", str(tmp_path / "a"))
    reset_settings()
    try:
        first = get_settings()
        clean_env.setenv("FROMSCRATCH_DATA_DIR", str(tmp_path / "b"))
        assert get_settings() is first
        reset_settings()
        assert get_settings().data_dir == (tmp_path / "b").resolve()
    finally:
        reset_settings()


def test_every_setting_is_documented_in_the_readme() -> None:
    """The README's configuration table is the operator's reference: a setting missing there is one
    nobody can find."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = {m.group(1) for m in re.finditer(r"^\| `(FROMSCRATCH_\w+)`", readme, re.M)}
    assert {f"FROMSCRATCH_{name.upper()}" for name in Settings.model_fields} <= table
