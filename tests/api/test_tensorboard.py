"""GET /v1/fine_tuning/jobs/{id}/tensorboard (no worker): the tar's event file, loaded by
TensorBoard's own EventAccumulator, holds one scalar per Metric row value (accuracy included, absent
values absent); a job without metrics gives a valid, empty log; another owner's job is a 404. The
hand-written CRC-32C agrees with TensorBoard's."""

from __future__ import annotations

import io
import os
import struct
import tarfile
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboard_crc

from api.tensorboard_events import masked_crc32c
from core.archives import extract_all
from core.models import Metric
from tests.api.conftest import Factory, Tenant


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def load(client: TestClient, tenant: Tenant, job_id: str, dest: Path) -> EventAccumulator:
    r = client.get(f"/v1/fine_tuning/jobs/{job_id}/tensorboard", headers=tenant.headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-tar"
    assert f'filename="{job_id}-tensorboard.tar"' in r.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        (name,) = tar.getnames()
        assert name.startswith(f"{job_id}/events.out.tfevents.")
        extract_all(tar, dest)
    accumulator = EventAccumulator(str(dest / job_id))
    accumulator.Reload()
    return accumulator


def test_the_event_file_holds_every_metric_value(
    client: TestClient, tenant: Tenant, other: Tenant, factory: Factory, session_factory: Any, tmp_path: Path
) -> None:
    job_id = factory.job(tenant.owner_id, status="running")
    values: dict[int, dict[str, Any]] = {
        1: {"train_loss": 5.25, "lr": 1e-4, "tokens_per_s": 900.5, "grad_norm": 2.5, "train_accuracy": 0.125},
        2: {"train_loss": 4.5, "lr": 2e-4, "tokens_per_s": 1000.0, "grad_norm": float("nan")},
        3: {"train_loss": 4.0, "val_loss": 4.75, "val_accuracy": 0.3, "lr": 3e-4, "tokens_per_s": 1100.0},
        4: {},  # a row without any value: no event
    }
    with session_factory() as s:
        for step, row in values.items():
            s.add(Metric(job_id=job_id, step=step, **row))
        s.commit()

    acc = load(client, tenant, job_id, tmp_path)
    assert sorted(acc.Tags()["scalars"]) == sorted(
        [
            "train/loss",
            "val/loss",
            "train/accuracy",
            "val/accuracy",
            "learning_rate",
            "tokens_per_s",
            "grad_norm",
        ]
    )

    def scalars(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    assert scalars("train/loss") == [(1, 5.25), (2, 4.5), (3, 4.0)]
    assert scalars("val/loss") == [(3, 4.75)]
    assert scalars("train/accuracy") == [(1, 0.125)]
    assert scalars("val/accuracy") == [(3, f32(0.3))]
    assert scalars("learning_rate") == [(1, f32(1e-4)), (2, f32(2e-4)), (3, f32(3e-4))]
    assert scalars("tokens_per_s") == [(1, 900.5), (2, 1000.0), (3, 1100.0)]
    assert scalars("grad_norm") == [(1, 2.5)]  # NaN is left out

    # another owner's job, and no such job: 404 (owner-scoped like every job route)
    r = client.get(f"/v1/fine_tuning/jobs/{job_id}/tensorboard", headers=other.headers)
    assert r.status_code == 404
    assert (
        client.get("/v1/fine_tuning/jobs/ftjob-nope/tensorboard", headers=tenant.headers).status_code == 404
    )
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}/tensorboard").status_code == 401


def test_a_job_without_metrics_is_an_empty_log(
    client: TestClient, tenant: Tenant, factory: Factory, tmp_path: Path
) -> None:
    job_id = factory.job(tenant.owner_id, status="queued")
    acc = load(client, tenant, job_id, tmp_path)
    assert acc.Tags()["scalars"] == []


def test_many_steps(client: TestClient, tenant: Tenant, factory: Factory, tmp_path: Path) -> None:
    job_id = factory.job(tenant.owner_id, status="running", total_steps=3000)
    factory.metrics(job_id, range(1, 3001), val_every=100)
    acc = load(client, tenant, job_id, tmp_path)
    train = acc.Scalars("train/loss")
    assert [e.step for e in train] == list(range(1, 3001))
    assert [e.value for e in train] == [f32(5.0 - s * 0.001) for s in range(1, 3001)]
    assert [e.step for e in acc.Scalars("val/loss")] == list(range(100, 3001, 100))


def test_crc32c_matches_tensorboards() -> None:
    for n in (0, 1, 3, 8, 9, 31, 100, 4096):
        data = os.urandom(n)
        assert masked_crc32c(data) == tensorboard_crc(data), n
