"""Fixtures for the API tests: the real app (`create_app(settings)`) in a TestClient against the
test session's Postgres and Redis, tenants (API keys of distinct owners), and small factories
that write files, jobs, metrics, events and checkpoints straight into the database (no worker)."""

from __future__ import annotations

import io
import secrets
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api.main import create_app
from core.blobstore import blobstore_from_settings
from core.keys import create_key
from core.models import Blob, Checkpoint, Event, File, Job, Metric
from core.settings import Settings
from trainer.config import TrainConfig, model_config_from_preset

SHAKESPEARE = Path(__file__).resolve().parents[1] / "data" / "tiny_shakespeare_100k.txt"


@dataclass
class Tenant:
    owner_id: str
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


@pytest.fixture
def app(settings: Settings) -> Any:
    return create_app(settings)


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def make_tenant(session_factory: sessionmaker[Session]) -> Callable[[], Tenant]:
    def make() -> Tenant:
        owner = f"owner-{secrets.token_hex(6)}"
        with session_factory() as session:
            _, secret = create_key(session, "api-test", owner_id=owner)
            session.commit()
        return Tenant(owner, secret)

    return make


@pytest.fixture
def tenant(make_tenant: Callable[[], Tenant]) -> Tenant:
    return make_tenant()


@pytest.fixture
def other(make_tenant: Callable[[], Tenant]) -> Tenant:
    return make_tenant()


def upload(
    client: TestClient, tenant: Tenant, content: bytes, filename: str = "data.txt", purpose: str = "fine-tune"
) -> Any:
    return client.post(
        "/v1/files",
        headers=tenant.headers,
        data={"purpose": purpose},
        files={"file": (filename, content, "application/octet-stream")},
    )


def count(session_factory: sessionmaker[Session], model: Any, *where: Any) -> int:
    with session_factory() as s:
        return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def blob_count(session_factory: sessionmaker[Session]) -> int:
    return count(session_factory, Blob)


class Factory:
    """Rows written the way the worker writes them."""

    def __init__(self, settings: Settings, session_factory: sessionmaker[Session]):
        self.settings = settings
        self.sf = session_factory
        self.store = blobstore_from_settings(settings, session_factory)

    def file(self, owner: str, content: bytes = b"hello world\n" * 200, filename: str = "t.txt") -> str:
        with self.sf() as s:
            blob = self.store.put([content], s)
            f = File(
                owner_id=owner,
                filename=filename,
                purpose="fine-tune",
                bytes=blob.size,
                sha256=blob.sha256,
                format="text",
                blob_id=blob.id,
            )
            s.add(f)
            s.commit()
            return f.id

    def job(
        self,
        owner: str,
        *,
        status: str = "running",
        file_id: str | None = None,
        total_steps: int = 100,
        created_at: datetime | None = None,
        **fields: Any,
    ) -> str:
        file_id = file_id or self.file(owner)
        with self.sf() as s:
            job = Job(
                owner_id=owner,
                model="llama-tiny",
                training_file=file_id,
                status=status,
                hyperparameters={},
                model_config=model_config_from_preset("llama-tiny").to_dict(),
                train_config=TrainConfig().to_dict(),
                seed=1,
                total_steps=total_steps,
                **fields,
            )
            if created_at is not None:
                job.created_at = created_at
            s.add(job)
            s.commit()
            return job.id

    def metrics(
        self, job_id: str, steps: range | list[int], *, val_every: int = 0, start: datetime | None = None
    ) -> None:
        start = start or datetime.now(UTC)
        with self.sf() as s:
            for i, step in enumerate(steps):
                s.add(
                    Metric(
                        job_id=job_id,
                        step=step,
                        train_loss=5.0 - step * 0.001,
                        val_loss=(5.1 - step * 0.001) if val_every and step % val_every == 0 else None,
                        lr=1e-3,
                        tokens_per_s=1000.0,
                        tokens_seen=step * 2048,
                        created_at=start + timedelta(milliseconds=i),
                    )
                )
            s.commit()

    def event(
        self,
        job_id: str,
        message: str,
        data: dict[str, Any] | None = None,
        created_at: datetime | None = None,
    ) -> int:
        with self.sf() as s:
            e = Event(job_id=job_id, message=message, data=data)
            if created_at is not None:
                e.created_at = created_at
            s.add(e)
            s.commit()
            return e.seq

    def set_status(self, job_id: str, status: str, **fields: Any) -> None:
        from core import jobstates

        with self.sf() as s:
            job = s.get(Job, job_id)
            assert job is not None
            jobstates.transition(s, job, status, **fields)
            s.commit()

    def checkpoint(
        self, job_id: str, step: int, model_id: str, *, tar_bytes: bytes | None = None, is_final: bool = False
    ) -> str:
        with self.sf() as s:
            job = s.get(Job, job_id)
            assert job is not None
            blob = self.store.put([tar_bytes or fake_tar()], s)
            c = Checkpoint(
                job_id=job_id,
                owner_id=job.owner_id,
                step=step,
                model_id=model_id,
                blob_id=blob.id,
                metrics={"step": step, "train_loss": 2.5, "valid_loss": 2.6},
                is_final=is_final,
            )
            s.add(c)
            s.commit()
            return c.id

    def finished_model(
        self, owner: str, *, tar_bytes: bytes | None = None, steps: tuple[int, ...] = (50,)
    ) -> tuple[str, str]:
        """A succeeded job with checkpoints at `steps` (the last one final); (job id, model id)."""
        job_id = self.job(owner, status="running")
        hexpart = job_id.split("-", 1)[1]
        model_id = f"ft:llama-tiny:{hexpart}"
        for step in steps:
            self.checkpoint(
                job_id, step, f"{model_id}:ckpt-step-{step}", tar_bytes=tar_bytes, is_final=step == steps[-1]
            )
        self.set_status(job_id, "succeeded", fine_tuned_model=model_id, step=steps[-1], trained_tokens=1000)
        return job_id, model_id


def fake_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = b"{}"
        info = tarfile.TarInfo("step-00000001/config.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def factory(settings: Settings, session_factory: sessionmaker[Session]) -> Factory:
    return Factory(settings, session_factory)
