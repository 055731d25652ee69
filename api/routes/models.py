"""/v1/models: your finished models and checkpoints (not deleted), download, delete; and the base
models (the presets a job trains), which list and retrieve like OpenAI's but have no weights.

Model ids contain colons (`ft:llama-tiny:abc123:ckpt-step-50`), so the routes use `{model_id:path}`;
the `/content` route is registered before the bare one so its suffix is not swallowed into the id
(`/generate`, a POST the bare GET/DELETE never take, is in api/routes/completions.py). DELETE hides
the model for good (a `deleted_models` row: 404 everywhere afterwards, no longer a base for new
jobs) and frees its exports and, once its job has ended, its weights (api/model_deletion.py).

`/content` streams the file through the API, or, with `s3_presigned_downloads` on and the file
stored on the s3 blob backend, answers 307 to a presigned S3 URL (the API sends no bytes).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy import select

from api.deps import BlobStoreDep, CurrentKey, SessionDep, SettingsDep
from api.errors import APIError, ErrorResponse
from api.exports import RETRY_AFTER_SECONDS, ExportPreparing, find_download
from api.model_deletion import delete_model as delete_model_and_weights
from api.queries import ModelRef, owned_model
from api.ranges import download_response
from api.request_text import json_router
from api.routes.files import content_disposition
from api.schemas import Deleted, ListEnvelope, Model, unix
from core.exports import CHECKPOINT, DEFAULT_DOWNLOAD, DOWNLOADS, DownloadFormat
from core.models import Checkpoint, DeletedModel, Job
from core.naming import root_preset
from core.status import JobStatus
from trainer.config import PRESETS
from trainer.config.export_formats import DEFAULT_DTYPE, ExportDtype, dtype_problem

router = json_router(prefix="/v1", tags=["models"])


def to_model(ref: ModelRef) -> Model:
    job = ref.job
    return Model(
        id=ref.id,
        created=unix(ref.created_at) or 0,
        owned_by=job.owner_id,
        kind=ref.kind,  # type: ignore[arg-type]
        job_id=job.id,
        step=ref.checkpoint.step if ref.checkpoint is not None else job.step,
        root=root_preset(job.model),
        parent=job.base_model_id,
        max_model_len=job.model_config.get("ctx"),
    )


def base_model(preset: str) -> Model:
    """A preset as OpenAI lists a base model: something to train, with nothing to download."""
    return Model(
        id=preset,
        created=0,
        owned_by="fromscratch",
        kind="base",
        job_id=None,
        root=preset,
        parent=None,
        max_model_len=PRESETS[preset]["ctx"],
        formats=[],
    )


@router.get(
    "/models",
    response_model=ListEnvelope[Model],
    summary="Your trained models and checkpoints, newest first, then the base models (presets)",
)
def list_models(session: SessionDep, key: CurrentKey) -> ListEnvelope[Model]:
    owner = key.owner_id
    deleted = set(session.scalars(select(DeletedModel.model_id).where(DeletedModel.owner_id == owner)).all())
    refs: dict[str, ModelRef] = {}
    jobs = {
        j.id: j
        for j in session.scalars(
            select(Job).where(
                Job.owner_id == owner, Job.status == JobStatus.SUCCEEDED, Job.fine_tuned_model.is_not(None)
            )
        ).all()
    }
    ckpts = session.scalars(select(Checkpoint).where(Checkpoint.owner_id == owner)).all()
    by_job: dict[str, list[Checkpoint]] = {}
    for c in ckpts:
        by_job.setdefault(c.job_id, []).append(c)
    for job in jobs.values():
        assert job.fine_tuned_model is not None
        mine = sorted(by_job.get(job.id, []), key=lambda c: (c.is_final, c.step))
        exact = [c for c in mine if c.model_id == job.fine_tuned_model]
        ckpt = exact[0] if exact else (mine[-1] if mine else None)
        refs[job.fine_tuned_model] = ModelRef(
            job.fine_tuned_model, "fine_tuned", job, ckpt, job.finished_at or job.created_at
        )
    missing_jobs = {c.job_id for c in ckpts if c.job_id not in jobs}
    if missing_jobs:
        jobs.update({j.id: j for j in session.scalars(select(Job).where(Job.id.in_(missing_jobs))).all()})
    for c in ckpts:
        if c.model_id in refs or c.job_id not in jobs:
            continue
        refs[c.model_id] = ModelRef(c.model_id, "checkpoint", jobs[c.job_id], c, c.created_at)
    models = [to_model(r) for r in refs.values() if r.id not in deleted]
    models.sort(key=lambda m: (m.created, m.id), reverse=True)
    return ListEnvelope.of(models + [base_model(name) for name in PRESETS])


@router.get(
    "/models/{model_id:path}/content",
    summary="Download a model: " + ", ".join(f"{d.name} (tar)" if d.is_folder else d.name for d in DOWNLOADS),
    description="A stored file answers 200 at once. An export not made yet answers 202 (a worker "
    "prepares it): ask again after `Retry-After` seconds until the 200 comes. A failed export answers "
    "its error once (400 `export_failed`), then the next request tries again.",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}, "application/x-tar": {}}},
        202: {
            "model": ExportPreparing,
            "description": "A worker is preparing this export; ask again after `Retry-After` seconds",
            "headers": {
                "Retry-After": {"description": "seconds until asking again", "schema": {"type": "integer"}}
            },
        },
        307: {
            "description": "With FROMSCRATCH_S3_PRESIGNED_DOWNLOADS on, a model stored in S3: download it "
            "from `Location`, a presigned URL valid for 15 minutes (send no Authorization header there)",
            "headers": {"Location": {"description": "the presigned URL", "schema": {"type": "string"}}},
        },
        206: {"description": "the bytes of the `Range` asked for (`Range: bytes=N-` resumes a download)"},
        416: {"model": ErrorResponse, "description": "the `Range` starts past the file's end"},
    },
)
def model_content(
    model_id: str,
    request: Request,
    session: SessionDep,
    key: CurrentKey,
    store: BlobStoreDep,
    settings: SettingsDep,
    format: Annotated[DownloadFormat, Query(description="the file to download")] = DEFAULT_DOWNLOAD,
    dtype: Annotated[ExportDtype, Query(description="weights precision of an export")] = DEFAULT_DTYPE,
) -> Response:
    ref = owned_model(session, key.owner_id, model_id)
    check_dtype(format, dtype if "dtype" in request.query_params else None)  # the default suits all
    found = find_download(
        session,
        ref,
        format,
        dtype,
        store=store,
        celery=request.app.state.celery,
        settings=settings,
    )
    session.commit()  # no transaction held open while the file streams
    if isinstance(found, ExportPreparing):
        return JSONResponse(
            found.model_dump(), status_code=202, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    disposition = content_disposition(found.filename)
    if settings.s3_presigned_downloads:  # the bytes come from S3 itself, when they are there
        url = store.presigned_url(found.blob_id, disposition, found.media_type)
        if url is not None:
            return RedirectResponse(url, status_code=307)
    return download_response(
        request, store, found.blob_id, found.media_type, {"Content-Disposition": disposition}
    )


def check_dtype(fmt: str, dtype: str | None) -> None:
    """400 naming dtype for a precision the format is not made in, before any worker is asked."""
    if dtype is None:
        return
    if fmt == CHECKPOINT.name:
        problem = None if dtype == DEFAULT_DTYPE else f"the checkpoint is the trained {DEFAULT_DTYPE} weights"
    else:
        problem = dtype_problem(fmt, dtype)
    if problem is not None:
        raise APIError(400, f"dtype={dtype}: {problem}", param="dtype", code="invalid_value")


@router.get("/models/{model_id:path}", response_model=Model, summary="Get a model")
def get_model(model_id: str, session: SessionDep, key: CurrentKey) -> Model:
    if model_id in PRESETS:
        return base_model(model_id)
    return to_model(owned_model(session, key.owner_id, model_id))


@router.delete("/models/{model_id:path}", response_model=Deleted, summary="Delete a model")
def delete_model(model_id: str, session: SessionDep, key: CurrentKey, store: BlobStoreDep) -> Deleted:
    ref = owned_model(session, key.owner_id, model_id)
    delete_model_and_weights(session, store, key.owner_id, ref)
    session.commit()
    return Deleted(id=ref.id, object="model")
