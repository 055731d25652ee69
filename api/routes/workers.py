"""GET /v1/workers (our extension): the workers running now, as they advertise themselves
(worker/advertise.py): the queues each consumes, its device kind and count, the memory of one
device, whether it is running a job. Rows not seen for lease_seconds are left out (a worker that
died). Any key may read it; it names no job, owner or secret. Admission does not read it: the
limits are settings (api/job_limits.py), so a restarting worker never changes what is accepted."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sqlalchemy import select

from api.deps import CurrentKey, SessionDep, SettingsDep
from api.schemas import ListEnvelope
from core.models import Job, Worker
from core.status import JobStatus

router = APIRouter(prefix="/v1", tags=["workers"])


class WorkerInfo(BaseModel):
    object: Literal["worker"] = "worker"
    id: str = Field(description="the worker's node name")
    queues: list[str] = Field(description="broker queues it consumes (gpu, gpu.2, ... up to its devices)")
    device_kind: Literal["cpu", "cuda"]
    devices: int = Field(description="the most devices one job runs on here")
    memory_bytes: int | None = Field(description="memory of one device (RAM on cpu)")
    busy: bool = Field(description="it is running a job now")
    started_at: int = Field(description="Unix seconds")
    seen_at: int = Field(description="Unix seconds of its last heartbeat")


@router.get(
    "/workers", response_model=ListEnvelope[WorkerInfo], summary="Workers and their devices (our extension)"
)
def list_workers(session: SessionDep, key: CurrentKey, settings: SettingsDep) -> ListEnvelope[WorkerInfo]:
    rows = session.scalars(
        select(Worker).where(Worker.alive(settings.lease_seconds)).order_by(Worker.id)
    ).all()
    owners = session.scalars(
        select(Job.lease_owner).where(Job.status == JobStatus.RUNNING, Job.lease_owner.is_not(None))
    ).all()
    running = {owner.rsplit(":", 1)[0] for owner in owners if owner}  # "<host>:<pid>:<claim>"
    return ListEnvelope.of(
        [
            WorkerInfo(
                id=w.id,
                queues=list(w.queues),
                device_kind="cuda" if w.device_kind == "cuda" else "cpu",
                devices=w.devices,
                memory_bytes=w.memory_bytes,
                busy=f"{w.host}:{w.pid}" in running,
                started_at=int(w.started_at.timestamp()),
                seen_at=int(w.seen_at.timestamp()),
            )
            for w in rows
        ]
    )
