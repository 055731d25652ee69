"""GET /v1/fine_tuning/hyperparameters: the JSON Schema of a job's `hyperparameters`, derived from
the trainer's config declarations (trainer.config.schema), with the presets. The dashboard renders its
new-job form from it; clients may validate against it before sending a job."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import CurrentKey
from trainer.config import schema

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])


@router.get("/hyperparameters", summary="JSON Schema of the hyperparameters a job accepts (our extension)")
def hyperparameter_schema(key: CurrentKey) -> dict[str, Any]:
    return schema.json_schema()
