"""GET /v1/fine_tuning/statuses: the job statuses and their sets (core.status), so the dashboard
and other clients take them from the service instead of keeping a copy."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import CurrentKey
from core.status import JobStatus, status_sets

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])


class StatusSets(BaseModel):
    object: Literal["fine_tuning.statuses"] = "fine_tuning.statuses"
    statuses: list[JobStatus] = Field(description="every status, in the order a successful job passes them")
    terminal: list[JobStatus] = Field(description="a job in one of these never changes again")
    claimable: list[JobStatus] = Field(description="a worker may pick up a job in one of these")
    active: list[JobStatus] = Field(description="a worker is on a job in one of these")


@router.get("/statuses", response_model=StatusSets, summary="Job statuses and their sets (our extension)")
def list_statuses(key: CurrentKey) -> StatusSets:
    return StatusSets.model_validate(status_sets())
