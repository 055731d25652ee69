"""GET /v1/fine_tuning/export_formats: what a model downloads as (the export formats of
trainer.config.export_formats, then `checkpoint`), the weight dtypes, and which formats a job makes
as it ends, so the dashboard and other clients take them from the service instead of keeping a copy."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import CurrentKey
from core.exports import served_export_formats

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])


class DownloadFormatInfo(BaseModel):
    name: str = Field(description="the `format` of GET /v1/models/{id}/content")
    title: str = Field(description="a short label")
    description: str
    extension: str = Field(description="the downloaded file's extension (`tar`: a folder or a checkpoint)")
    media_type: str
    dtypes: list[str] = Field(description="the `dtype`s this format is made in (none: it has no dtype)")


class DtypeInfo(BaseModel):
    name: str = Field(description="the `dtype` of GET /v1/models/{id}/content")
    description: str


class ExportFormats(BaseModel):
    object: Literal["fine_tuning.export_formats"] = "fine_tuning.export_formats"
    formats: list[DownloadFormatInfo] = Field(description="every download format, exports first")
    dtypes: list[DtypeInfo] = Field(description="every weight dtype, largest first")
    default_format: str
    default_dtype: str
    made_at_job_end: list[str] = Field(
        description="the formats a job exports as it ends unless its `export_formats` says otherwise; "
        "the others are made on first download"
    )
    job_end_dtype: str = Field(description="the dtype of the exports made as a job ends")


@router.get(
    "/export_formats",
    response_model=ExportFormats,
    summary="Model download formats and weight dtypes (our extension)",
)
def list_export_formats(key: CurrentKey) -> ExportFormats:
    return ExportFormats.model_validate(served_export_formats())
