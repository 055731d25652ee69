"""/v1/files: upload (multipart `file` + `purpose=fine-tune`), list, get, content, delete.

Upload path, never holding the file in memory:
1. the multipart body is parsed as it streams in (api/uploads.py): the `file` part is written
   straight to a named temporary file under `work_dir/uploads`, and the body is cut off with a 400
   (param "file") as soon as it passes `max_upload_bytes`; the form fields are checked against
   `FileUploadFields` (`purpose`);
2. the temp file is validated with trainer.data.formats.validate_file (empty, binary, broken JSONL:
   400 naming the line, param "file") — nothing has been stored yet;
3. it is copied into the blob store a piece at a time (the backend's: fs 8 MiB, db 1 MiB, s3 one
   8 MiB part; size + sha256 recorded) and the File row is committed with the blob's completion, so
   a failed upload leaves no rows, no blobs and no temporary file. The API process grows by a few
   tens of MB at most for a 1 GiB upload (bench/upload_rss.py).

Storage quota (`max_stored_bytes_per_key`: files + checkpoints + exports): an upload that would take
the key past it is a 429 `quota_exceeded` (api/quotas.py): at once when the Content-Length says
so, else as soon as the file part passes the room left, and last under the owner's quota lock
before the File row is committed (concurrent uploads cannot overshoot it); nothing is kept.

DELETE is refused (400) while a job that has not finished uses the file. A file a finished job
refers to keeps its row (the job's `training_file` must stay a valid reference) but its bytes are
freed (blob_id None) and it is marked `deleted_at`, which every route treats as gone. A job's
results CSV (purpose `fine-tune-results`, format `csv`, written by the worker when the job succeeds:
worker/result_file.py) is listed and downloaded like any file; deleting it also takes its id out of
the job's `result_files`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import anyio.from_thread
from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from sqlalchemy import Text, and_, cast, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.deps import BlobStoreDep, CurrentKey, SessionDep, SettingsDep
from api.errors import APIError, ErrorResponse, not_found, quote_input
from api.file_uploads import IDEMPOTENCY_KEY_CHARS, check_client, earlier_file
from api.queries import AfterId, bad_cursor, live_files, newest_first_after, owned_file
from api.quotas import check_files, check_storage, storage_exceeded
from api.ranges import download_response
from api.request_models import FileUploadFields
from api.schemas import Deleted, FileObject, ListEnvelope, to_file
from api.uploads import MULTIPART_SLACK, Upload, received_upload, too_large
from core.blobstore import BlobStore
from core.models import RESULTS_PURPOSE, Blob, File, FilePurpose, Job, utcnow
from core.quotas import stored_bytes
from core.settings import Settings
from core.status import TERMINAL

if TYPE_CHECKING:
    from trainer.data.formats import FileSummary

router = APIRouter(prefix="/v1", tags=["files"])

# File.format -> the media type of its content ("text" and anything else: plain text)
MEDIA_TYPES = {"jsonl": "application/jsonl", "csv": "text/csv; charset=utf-8"}
# The body is read by api/uploads.py, not by FastAPI: describe it for the OpenAPI document.
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", *FileUploadFields.model_json_schema().get("required", [])],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "the training data: UTF-8 text, or JSONL records",
                        },
                        **FileUploadFields.model_json_schema()["properties"],
                    },
                },
                "example": {"purpose": "fine-tune", "file": "To be, or not to be, that is the question.\n"},
            }
        },
    }
}


def _form_fields(upload: Upload) -> FileUploadFields:
    if upload.path is None:
        raise APIError(
            400,
            "Missing the `file` part: send the training data as a multipart file field named `file`.",
            param="file",
            code="missing_file",
        )
    try:
        return FileUploadFields.model_validate(upload.fields)
    except ValidationError as e:  # answered like any other request that fails its model
        raise RequestValidationError(e.errors(include_url=False)) from e


@router.post("/files", response_model=FileObject, summary="Upload a training file", openapi_extra=UPLOAD_BODY)
async def upload_file(
    request: Request,
    key: CurrentKey,
    settings: SettingsDep,
    store: BlobStoreDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=IDEMPOTENCY_KEY_CHARS,
            description="a retry with the same key gets the file the first upload stored",
        ),
    ] = None,
) -> FileObject:
    limit = settings.max_upload_bytes
    header = request.headers.get("content-length")
    declared = int(header) if header and header.isdigit() else None
    if declared is not None and declared > limit + MULTIPART_SLACK:
        raise too_large(limit)
    quota = settings.max_stored_bytes_per_key
    used = await run_in_threadpool(_stored_bytes, request, key.owner_id)
    room = quota - used
    if room <= 0 or (declared is not None and declared - MULTIPART_SLACK > room):
        raise storage_exceeded(quota, used, declared, "this upload", "file")

    def check_file_bytes(n: int) -> None:
        if n > room:  # cut the stream: nothing more is read or kept
            raise storage_exceeded(quota, used, None, "this upload", "file")

    upload_dir = settings.work_path / "uploads"
    async with received_upload(
        request, upload_dir, limit, check_file_bytes, body_timeout=settings.upload_body_timeout_seconds
    ) as upload:
        fields = _form_fields(upload)
        assert upload.path is not None
        filename = (upload.filename or "upload")[:500]
        owner = Owner(key.owner_id, idempotency_key, lambda: anyio.from_thread.run(request.is_disconnected))
        return await run_in_threadpool(
            _validate_and_store, request, owner, upload.path, filename, fields.purpose, settings, store
        )


@dataclass(frozen=True)
class Owner:
    """Who uploads: the owner, the request's Idempotency-Key, and whether its client is gone."""

    id: str
    idempotency_key: str | None
    gone: Callable[[], bool]


def _stored_bytes(request: Request, owner_id: str) -> int:
    with request.app.state.session_factory() as session:
        return stored_bytes(session, owner_id)


def _validated(path: Path, filename: str, settings: Settings) -> FileSummary:
    """The upload checked as training data; 400 `invalid_file` saying what is wrong and where."""
    from trainer.data.formats import DataError, JSONTooDeep, validate_file

    limit = settings.max_upload_bytes
    if path.stat().st_size > limit:
        raise too_large(limit)
    try:
        return validate_file(path, max_bytes=limit, name="the file", max_depth=settings.max_json_depth)
    except DataError as e:
        setting = " (setting FROMSCRATCH_MAX_JSON_DEPTH)" if isinstance(e, JSONTooDeep) else ""
        raise APIError(
            400,
            f"Invalid training file {quote_input(filename)}: {e.message}{setting}",
            param="file",
            code="invalid_file",
        ) from e


def _validate_and_store(
    request: Request,
    owner: Owner,
    path: Path,
    filename: str,
    purpose: str,
    settings: Settings,
    store: BlobStore,
) -> FileObject:
    from trainer.data.formats import file_sha256

    limit = settings.max_upload_bytes
    summary = _validated(path, filename, settings)
    session = request.app.state.session_factory()
    blob = None
    try:
        sha256 = file_sha256(path) if owner.idempotency_key else ""
        if (earlier := earlier_file(session, owner.id, owner.idempotency_key, sha256)) is not None:
            return to_file(earlier)  # a retry of a stored upload: nothing stored twice
        check_client(owner.gone, owner.id)
        # the file itself, not an iterator over it: the store reads it in the pieces it writes
        # (fs: 8 MiB), with no re-cutting copy
        blob = store.put_file(path, session, max_bytes=limit)
        check_storage(session, owner.id, settings.max_stored_bytes_per_key, blob.size, "this upload", "file")
        check_files(session, owner.id, settings.max_files_per_key)
        row = File(
            owner_id=owner.id,
            filename=filename,
            purpose=purpose,
            bytes=blob.size,
            sha256=blob.sha256,
            format=summary.format,
            max_tokens=summary.max_tokens,
            max_trained_tokens=summary.max_trained_tokens,
            blob_id=blob.id,
            idempotency_key=owner.idempotency_key or None,
        )
        session.add(row)
        check_client(owner.gone, owner.id)
        session.commit()
        return to_file(row)
    except IntegrityError:  # a concurrent upload under the same Idempotency-Key was committed first
        _forget(session, store, blob)
        winner = earlier_file(session, owner.id, owner.idempotency_key, sha256)
        if winner is None:
            raise
        return to_file(winner)
    except BaseException:
        _forget(session, store, blob)
        raise
    finally:
        session.close()


def _forget(session: Session, store: BlobStore, blob: Blob | None) -> None:
    """Roll back; a blob written but not committed is removed now rather than at the next gc."""
    session.rollback()
    if blob is not None:
        with contextlib.suppress(Exception):
            store.delete(blob.id, session)
            session.commit()


@router.get("/files", response_model=ListEnvelope[FileObject], summary="List your files, newest first")
def list_files(
    session: SessionDep,
    key: CurrentKey,
    after: AfterId = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="page size")] = 100,
    purpose: Annotated[FilePurpose | None, Query(description="only files of this purpose")] = None,
    order: Annotated[Literal["asc", "desc"], Query(description="by creation time")] = "desc",
) -> ListEnvelope[FileObject]:
    q = live_files(key.owner_id)
    if purpose:
        q = q.where(File.purpose == purpose)
    if after:
        cursor = session.scalar(live_files(key.owner_id).where(File.id == after))
        if cursor is None:
            raise bad_cursor(after)
        if order == "desc":
            q = q.where(newest_first_after(File, cursor))
        else:
            q = q.where(
                or_(
                    File.created_at > cursor.created_at,
                    and_(File.created_at == cursor.created_at, File.id > cursor.id),
                )
            )
    if order == "desc":
        q = q.order_by(File.created_at.desc(), File.id.desc())
    else:
        q = q.order_by(File.created_at.asc(), File.id.asc())
    rows = session.scalars(q.limit(limit + 1)).all()
    data = [to_file(f) for f in rows[:limit]]
    return ListEnvelope.of(data, has_more=len(rows) > limit)


@router.get("/files/{file_id}", response_model=FileObject, summary="Get a file's metadata")
def get_file(file_id: str, session: SessionDep, key: CurrentKey) -> FileObject:
    return to_file(owned_file(session, key.owner_id, file_id))


@router.get(
    "/files/{file_id}/content",
    summary="Download a file's bytes",
    response_class=StreamingResponse,
    description="`Range: bytes=N-` answers 206 with the bytes from N on (a broken download resumes).",
    responses={
        200: {"content": {"application/jsonl": {}, "text/plain": {}, "text/csv": {}}},
        206: {"description": "the bytes of the `Range` asked for"},
        416: {"model": ErrorResponse, "description": "the `Range` starts past the file's end"},
    },
)
def file_content(
    file_id: str, request: Request, session: SessionDep, key: CurrentKey, store: BlobStoreDep
) -> StreamingResponse:
    f = owned_file(session, key.owner_id, file_id)
    if f.blob_id is None:  # only deleted files have no bytes, and owned_file skips those
        raise not_found("file", file_id)
    media = MEDIA_TYPES.get(f.format, "text/plain; charset=utf-8")
    disposition = {"Content-Disposition": content_disposition(f.filename)}
    return download_response(request, store, f.blob_id, media, disposition)


def _drop_from_result_files(session: Session, f: File) -> None:
    """A deleted results file leaves its job's `result_files`, so the job never names a file that
    reads as 404. (The list is JSON text on both databases: `["file-..."]`.)"""
    naming = session.scalars(
        select(Job).where(
            Job.owner_id == f.owner_id, cast(Job.result_files, Text).contains(f'"{f.id}"', autoescape=True)
        )
    ).all()
    for job in naming:
        job.result_files = [i for i in job.result_files or [] if i != f.id]


def content_disposition(filename: str) -> str:
    from urllib.parse import quote

    ascii_name = re.sub(r"[^A-Za-z0-9._-]+", "_", filename) or "download"
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}"


@router.delete("/files/{file_id}", response_model=Deleted, summary="Delete a file")
def delete_file(file_id: str, session: SessionDep, key: CurrentKey, store: BlobStoreDep) -> Deleted:
    f = owned_file(session, key.owner_id, file_id)
    users = session.scalars(
        select(Job).where((Job.training_file == f.id) | (Job.validation_file == f.id))
    ).all()
    live = [j.id for j in users if j.status not in TERMINAL]
    if live:
        raise APIError(
            400,
            f"File {f.id} is used by job(s) that have not finished: {', '.join(live)}. "
            "Cancel them or wait until they finish, then delete the file.",
            param="file_id",
            code="file_in_use",
        )
    if f.purpose == RESULTS_PURPOSE:
        _drop_from_result_files(session, f)
    old_blob = f.blob_id
    if users:
        # Finished jobs still name this file: keep the row (marked deleted), free the bytes.
        f.deleted_at = utcnow()
        f.blob_id = None
    else:
        session.delete(f)
    session.flush()
    if old_blob is not None:
        store.delete(old_blob, session)
    session.commit()
    return Deleted(id=file_id, object="file")
