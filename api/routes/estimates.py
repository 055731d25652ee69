"""POST /v1/fine_tuning/jobs/estimate: what a job would be (parameters, memory, steps, tokens, time
on its worker class) before it is created; the new-job form asks as the user types. The body is a
create request's; api/job_estimate.py holds the arithmetic, admission's own."""

from __future__ import annotations

from typing import Any

from api.deps import CurrentKey, SessionDep, SettingsDep
from api.job_estimate import estimate_job
from api.request_models import JobCreate
from api.request_text import json_router

router = json_router(prefix="/v1/fine_tuning", tags=["fine-tuning"])


@router.post(
    "/jobs/estimate",
    summary="Estimate a job before creating it: parameters, memory, tokens, time (our extension)",
)
def estimate(body: JobCreate, session: SessionDep, key: CurrentKey, settings: SettingsDep) -> dict[str, Any]:
    return estimate_job(session, key.owner_id, body, settings)
