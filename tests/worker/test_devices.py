"""What a training worker has decides what it takes (worker/devices.py, issue 12): a worker
consumes its queue for every device count up to its own, refuses to start when told it has more
devices than it does, and so leaves a job routed for more devices than it has in the broker, never
half-starting it. Real `fromscratch worker` subprocesses on the real database and broker."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
from sqlalchemy import update

from core.broker import TRAIN_TASK, enqueue_job, make_celery
from core.broker_queues import queued_job_ids
from core.device_queues import job_queue
from core.models import Job
from core.settings import Settings
from tests.fixtures.service import (
    ServiceProcess,
    env_from_settings,
    fromscratch_cmd,
    get_job,
    make_job,
    wait_for_status,
)
from worker.devices import DeviceError, available_devices, worker_queues


def test_what_a_worker_consumes(tmp_path: Any) -> None:
    cores = available_devices("cpu")
    assert worker_queues(Settings(data_dir=tmp_path, worker_queues="cpu")) == (1, ["cpu"])
    assert worker_queues(Settings(data_dir=tmp_path, worker_queues="inference")) == (1, ["inference"])
    if cores >= 2:
        got = worker_queues(Settings(data_dir=tmp_path, worker_queues="cpu", worker_devices=2))
        assert got == (2, ["cpu.2", "cpu"])
    with pytest.raises(DeviceError, match=f"worker_devices={cores + 1}"):
        worker_queues(Settings(data_dir=tmp_path, worker_queues="cpu", worker_devices=cores + 1))
    gpus = available_devices("cuda")
    devices, queues = worker_queues(Settings(data_dir=tmp_path, worker_queues="gpu"))
    assert devices == max(1, gpus) and queues[-1] == "gpu" and len(queues) == devices
    mixed = worker_queues(Settings(data_dir=tmp_path, worker_queues="cpu,gpu"))
    assert mixed[1][0] == "cpu" and mixed[1][1:] == queues  # its cpu queue stays single-device
    with pytest.raises(DeviceError, match="cuda device"):
        worker_queues(Settings(data_dir=tmp_path, worker_queues="gpu", worker_devices=gpus + 1))


@pytest.mark.parametrize(("queue", "kind"), [("cpu", "cpu"), ("gpu", "cuda")])
def test_a_worker_told_it_has_more_devices_than_it_does_refuses_to_start(
    settings: Settings, queue: str, kind: str
) -> None:
    too_many = available_devices(kind) + 1
    env = env_from_settings(settings, FROMSCRATCH_WORKER_DEVICES=str(too_many))
    done = subprocess.run(
        fromscratch_cmd("worker", "--queues", queue), env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert f"worker_devices={too_many}" in done.stderr and "cannot run" in done.stderr


def test_a_one_device_worker_leaves_a_two_device_job_in_its_queue(
    settings: Settings, session_factory: Any, worker_proc: ServiceProcess
) -> None:
    # the two-device job is routed to cpu.2 (as the API does); the worker (worker_devices 0 -> 1 on
    # cpu) consumes only `cpu`, so it runs the one-device job sent after it and never the other
    wide = make_job(settings, session_factory, train={"max_steps": 2}, enqueue=False)
    with session_factory() as s:
        job = s.get(Job, wide)
        assert job is not None
        s.execute(
            update(Job)
            .where(Job.id == wide)
            .values(queue=job_queue("cpu", 2), train_config={**job.train_config, "devices": 2})
        )
        s.commit()
    celery = make_celery(settings)
    try:
        enqueue_job(celery, wide, job_queue("cpu", 2))
        narrow = make_job(settings, session_factory, train={"max_steps": 2})
        wait_for_status(session_factory, narrow, "succeeded", diagnostics=worker_proc.output)
        assert "consuming cpu" in worker_proc.output(tail=10**9)  # its first line: the whole log
        untouched = get_job(session_factory, wide)
        assert untouched.status == "queued" and untouched.lease_owner is None, untouched
        assert untouched.attempts == 0
        assert queued_job_ids(celery, TRAIN_TASK, ["cpu.2"]) == [wide]
    finally:
        with celery.connection_for_write() as conn:  # take the message: no later test meets it
            while conn.default_channel.basic_get("cpu.2", no_ack=True) is not None:
                pass
        celery.close()


@pytest.fixture(params=["redis", "sqla"])
def isolated(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """(settings, session_factory, celery) on a database and broker of this test's own."""
    from core.db import make_engine, make_session_factory

    if request.param == "redis":
        settings = Settings(
            database_url=request.getfixturevalue("pg_database_factory")(),
            broker_url=request.getfixturevalue("throwaway_redis").url,
            data_dir=tmp_path,
            blob_backend="db",
        )
        engine = make_engine(settings.database_url)
        session_factory = make_session_factory(engine)
    else:
        settings = request.getfixturevalue("sqlite_settings")
        session_factory = request.getfixturevalue("sqlite_session_factory")
        engine = None
    celery = make_celery(settings)
    yield settings, session_factory, celery
    celery.close()
    if engine is not None:
        engine.dispose()


def test_the_reaper_resends_a_lost_routed_job_to_its_own_queue(isolated: Any) -> None:
    # jobs.queue holds the routed name, so a re-send (here the reaper's) keeps the job's route
    from datetime import timedelta

    from core.blobstore import blobstore_from_settings
    from core.models import utcnow
    from worker.reaper import Reaper

    settings, session_factory, celery = isolated
    job_id = make_job(settings, session_factory, status="queued", enqueue=False)
    with session_factory() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(queue=job_queue("gpu", 4), updated_at=utcnow() - timedelta(minutes=1))
        )
        s.commit()
    store = blobstore_from_settings(settings, session_factory)
    reaper = Reaper(celery, settings, session_factory, store, interval=0.01)
    assert reaper.run_once()["resent"] == []  # missing once: a worker may be taking it
    assert reaper.run_once()["resent"] == [job_id]
    assert queued_job_ids(celery, TRAIN_TASK, ["gpu.4"]) == [job_id]
    assert queued_job_ids(celery, TRAIN_TASK, ["gpu", "cpu"]) == []


def test_a_worker_keeps_torch_compiles_cache_in_its_data_dir(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.cli import keep_compiled_kernels

    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FROMSCRATCH_COMPILE_MEMORY"):
        monkeypatch.setenv(name, "")  # recorded, so what the worker sets is undone after the test
        monkeypatch.delenv(name)
    keep_compiled_kernels(settings)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(settings.work_path / "inductor-cache")
    assert os.environ["TRITON_CACHE_DIR"] == str(settings.work_path / "triton-cache")
    assert os.environ["FROMSCRATCH_COMPILE_MEMORY"] == str(settings.work_path / "compile-times.json")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")  # an operator's choice stays
    keep_compiled_kernels(settings)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"
