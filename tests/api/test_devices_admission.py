"""`devices` at job creation (issue 12): a job asking for more devices than the largest worker of
its queue (cpu_worker_devices / gpu_worker_devices) is a 400 naming `devices` and the limit, and
nothing is written; an accepted multi-device job waits in its routed queue (`gpu.2`), read from the
real broker. On PostgreSQL + Redis and on the embedded SQLite + SQL broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.job_limits import JobTooLarge, check_job_limits
from api.main import create_app
from core.broker import TRAIN_TASK
from core.broker_queues import queued_job_ids
from core.keys import create_key
from core.models import Job
from core.settings import Settings
from tests.api.conftest import SHAKESPEARE, Tenant, count, upload
from tests.api.test_errors import assert_envelope
from trainer.config import TrainConfig, model_config_from_preset

JOBS = "/v1/fine_tuning/jobs"


def schema_max_devices() -> int:
    """The most devices TrainConfig accepts today (1 until distributed training raises it)."""
    for meta in TrainConfig.model_fields["devices"].metadata:
        if (le := getattr(meta, "le", None)) is not None:
            return int(le)
    return 1 << 30


def new_tenant(session_factory: Any) -> Tenant:
    with session_factory() as s:
        key, secret = create_key(s, "devices")
        s.commit()
    return Tenant(key.owner_id, secret)


def create(client: TestClient, tenant: Tenant, hyperparameters: dict[str, Any]) -> Any:
    fid = upload(client, tenant, SHAKESPEARE.read_bytes(), "s.txt").json()["id"]
    body = {"model": "llama-tiny", "training_file": fid, "hyperparameters": hyperparameters}
    return client.post(JOBS, headers=tenant.headers, json=body)


def assert_devices_refused(settings: Settings, session_factory: Any, hyperparameters: dict[str, Any]) -> None:
    tenant = new_tenant(session_factory)
    with TestClient(create_app(settings)) as client:
        err = assert_envelope(create(client, tenant, hyperparameters), 400)
    assert err["param"] == "devices", err
    assert count(session_factory, Job, Job.owner_id == tenant.owner_id) == 0
    if schema_max_devices() >= hyperparameters["devices"]:
        # past the schema's bound, the refusal is the admission check's: it names the limit
        queue = "gpu" if hyperparameters.get("device") == "cuda" else "cpu"
        assert err["code"] == JobTooLarge.code, err
        assert f"FROMSCRATCH_{queue.upper()}_WORKER_DEVICES" in err["message"], err
        assert "devices <= 1" in err["message"], err


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_more_devices_than_any_worker_is_400_on_postgres(
    settings: Settings, session_factory: Any, device: str
) -> None:
    assert_devices_refused(settings, session_factory, {"device": device, "devices": 2, "max_steps": 3})


def test_more_devices_than_any_worker_is_400_on_sqlite(
    sqlite_settings: Settings, sqlite_session_factory: Any
) -> None:
    assert_devices_refused(sqlite_settings, sqlite_session_factory, {"devices": 2, "max_steps": 3})


def test_one_device_jobs_keep_the_cpu_and_gpu_queues(settings: Settings, session_factory: Any) -> None:
    tenant = new_tenant(session_factory)
    with TestClient(create_app(settings)) as client:
        for device, queue in (("cpu", "cpu"), ("cuda", "gpu")):
            r = create(client, tenant, {"device": device, "max_steps": 3})
            assert r.status_code == 200, r.text
            assert r.json()["queue"] == queue
            client.post(f"{JOBS}/{r.json()['id']}/cancel", headers=tenant.headers)


@pytest.mark.skipif(schema_max_devices() < 2, reason="TrainConfig.devices is bounded to 1 until DDP lands")
@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_an_accepted_multi_device_job_waits_in_its_own_queue(
    backend: str, request: pytest.FixtureRequest
) -> None:
    prefix = "" if backend == "postgres" else "sqlite_"
    base: Settings = request.getfixturevalue(f"{prefix}settings")
    session_factory = request.getfixturevalue(f"{prefix}session_factory")
    settings = base.model_copy(update={"gpu_worker_devices": 2})
    tenant = new_tenant(session_factory)
    with TestClient(create_app(settings)) as client:
        r = create(client, tenant, {"device": "cuda", "devices": 2, "max_steps": 3})
        assert r.status_code == 200, r.text
        job_id = r.json()["id"]
        assert r.json()["queue"] == "gpu.2"
        celery = client.app.state.celery  # type: ignore[attr-defined]
        assert job_id in queued_job_ids(celery, TRAIN_TASK, ["gpu.2"])
        assert job_id not in queued_job_ids(celery, TRAIN_TASK, ["gpu"])
        client.post(f"{JOBS}/{job_id}/cancel", headers=tenant.headers)


# ---------------------------------------------------------------- api.job_limits, unit


def check_devices(tmp_path: Path, devices: int, queue: str, **limits: Any) -> None:
    check_job_limits(
        model_config_from_preset("llama-tiny"),
        # past the schema's bound on purpose: the admission check must hold on its own
        TrainConfig(device="cuda" if queue == "gpu" else "cpu").model_copy(update={"devices": devices}),
        queue=queue,
        training_tokens=10**6,
        has_validation_file=False,
        given=set(),
        continuing=False,
        settings=Settings(data_dir=tmp_path, **limits),
    )


def test_the_devices_check_names_the_field_and_the_limit(tmp_path: Path) -> None:
    check_devices(tmp_path, 4, "gpu", gpu_worker_devices=4)
    check_devices(tmp_path, 1, "cpu")
    with pytest.raises(JobTooLarge) as e:
        check_devices(tmp_path, 8, "gpu", gpu_worker_devices=4, cpu_worker_devices=16)
    assert e.value.param == "devices"
    assert "the 4 devices of the largest gpu worker (FROMSCRATCH_GPU_WORKER_DEVICES)" in e.value.message
    assert "devices <= 4" in e.value.message
    with pytest.raises(JobTooLarge) as e:
        check_devices(tmp_path, 2, "cpu", gpu_worker_devices=8)
    assert e.value.param == "devices" and "FROMSCRATCH_CPU_WORKER_DEVICES" in e.value.message
