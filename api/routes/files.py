"""/v1/files: upload (multipart `file` + `purpose=fine-tune`), list, get, content, delete.

Upload path, never holding the file in memory:
1. the multipart body is parsed as it streams in; the `file` part is written straight to a named
   temporary file under `work_dir/uploads` (1 MiB pieces), and the body is cut off with a 400
   (param "file") as soon as it passes `max_upload_bytes`;
2. the temp file is validated with trainer.dataformat.validate_file (empty, binary, broken JSONL:
   400 naming the line, param "file") — nothing has been stored yet;
3. it is copied into the blob store in 1 MiB chunks (size + sha256 recorded) and the File row is
   committed with the blob's completion, so a failed upload leaves no rows and no blobs.

DELETE is refused (400) while a job that has not finished uses the file. A file a finished job
refers to keeps its row (the job's `training_file` must stay a valid reference) but its bytes are
freed (blob_id None) and it is marked `deleted_at`, which every route treats as gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import and_, or_, select
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from api.deps import BlobStoreDep, CurrentKey, SessionDep, SettingsDep
from api.errors import APIError
from api.queries import bad_cursor, check_limit, live_files, newest_first_after, owned_file
from api.schemas import TERMINAL, Deleted, FileObject, ListEnvelope, to_file
from core.models import File, Job, utcnow

router = APIRouter(prefix="/v1", tags=["files"])

PURPOSES = ("fine-tune",)
CHUNK = 1 << 20
MULTIPART_SLACK = 64 * 1024  # headers and boundaries around the file part


def _safe_suffix(filename: str) -> str:
    """Keep a short alphanumeric extension (format detection looks at `.jsonl`)."""
    suffix = Path(filename).suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,10}", suffix) else ""


class _UploadParser(MultiPartParser):
    """Starlette's streaming multipart parser, with file parts written to a named temporary file
    in `upload_dir` (instead of a SpooledTemporaryFile) so the validator can open it by path."""

    def __init__(self, headers: Headers, stream: Any, upload_dir: Path) -> None:
        super().__init__(headers, stream, max_files=1, max_fields=16, max_part_size=64 * 1024)
        self.upload_dir = upload_dir
        self.paths: list[Path] = []

    def on_headers_finished(self) -> None:
        super().on_headers_finished()
        upload = self._current_part.file
        if upload is not None:
            upload.file.close()  # the SpooledTemporaryFile the base class made (still empty)
            fd, name = tempfile.mkstemp(
                dir=self.upload_dir, prefix="upload-", suffix=_safe_suffix(upload.filename or "")
            )
            os.close(fd)
            fh = open(name, "w+b")  # noqa: SIM115 - closed by upload_file
            self.paths.append(Path(name))
            self._files_to_close_on_error.append(fh)  # type: ignore[arg-type]
            upload.file = fh


def _too_large(limit: int) -> APIError:
    return APIError(
        400,
        f"The file is larger than the upload limit of {limit} bytes (setting FROMSCRATCH_MAX_UPLOAD_BYTES).",
        param="file",
        code="file_too_large",
    )


@router.post("/files", response_model=FileObject, summary="Upload a training file")
async def upload_file(
    request: Request, key: CurrentKey, settings: SettingsDep, store: BlobStoreDep
) -> FileObject:
    limit = settings.max_upload_bytes
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise APIError(
            400,
            "Upload files as multipart/form-data with a `file` part and `purpose=fine-tune`.",
            param="file",
            code="invalid_content_type",
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + MULTIPART_SLACK:
        raise _too_large(limit)

    async def limited() -> Any:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit + MULTIPART_SLACK:
                raise _too_large(limit)
            yield chunk

    upload_dir = Path(settings.work_dir) / "uploads"
    upload_dir.mkdir(parents=True, exist_ok=True)
    parser = _UploadParser(request.headers, limited(), upload_dir)
    try:
        try:
            form = await parser.parse()
        except MultiPartException as e:
            raise APIError(
                400, f"Invalid multipart body: {e.message}", param="file", code="invalid_multipart"
            ) from e
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise APIError(
                400,
                "Missing the `file` part: send the training data as a multipart file field named `file`.",
                param="file",
                code="missing_file",
            )
        if not isinstance(purpose, str) or not purpose:
            raise APIError(
                400, "Missing `purpose`: send purpose=fine-tune.", param="purpose", code="missing_purpose"
            )
        if purpose not in PURPOSES:
            raise APIError(
                400, f"purpose must be 'fine-tune', got {purpose!r}.", param="purpose", code="invalid_purpose"
            )
        upload.file.flush()
        path = Path(upload.file.name)  # type: ignore[union-attr]
        filename = (upload.filename or path.name)[:500]
        return await run_in_threadpool(
            _validate_and_store, request, key.owner_id, path, filename, purpose, limit, store
        )
    finally:
        for f in parser._files_to_close_on_error:
            with contextlib.suppress(Exception):
                f.close()
        for p in parser.paths:
            p.unlink(missing_ok=True)


def _validate_and_store(
    request: Request, owner_id: str, path: Path, filename: str, purpose: str, limit: int, store: Any
) -> FileObject:
    from trainer.dataformat import DataError, validate_file

    if path.stat().st_size > limit:
        raise _too_large(limit)
    try:
        summary = validate_file(path, max_bytes=limit)
    except DataError as e:
        raise APIError(
            400, f"Invalid training file {filename!r}: {e.message}", param="file", code="invalid_file"
        ) from e
    session = request.app.state.session_factory()
    blob = None
    try:
        with open(path, "rb") as fh:
            blob = store.put(iter(lambda: fh.read(CHUNK), b""), session, max_bytes=limit)
        row = File(
            owner_id=owner_id,
            filename=filename,
            purpose=purpose,
            bytes=blob.size,
            sha256=blob.sha256,
            format=summary.format,
            blob_id=blob.id,
        )
        session.add(row)
        session.commit()
        return to_file(row)
    except BaseException:
        session.rollback()
        if blob is not None:  # written but not committed: remove it now rather than at the next gc
            with contextlib.suppress(Exception):
                store.delete(blob.id, session)
                session.commit()
        raise
    finally:
        session.close()


@router.get("/files", response_model=ListEnvelope[FileObject], summary="List your files, newest first")
def list_files(
    session: SessionDep,
    key: CurrentKey,
    after: str | None = None,
    limit: Annotated[int, Query()] = 100,
    purpose: str | None = None,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> ListEnvelope[FileObject]:
    check_limit(limit, 10000)
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
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def file_content(
    file_id: str, session: SessionDep, key: CurrentKey, store: BlobStoreDep
) -> StreamingResponse:
    f = owned_file(session, key.owner_id, file_id)
    chunks = store.open(f.blob_id)
    media = "application/jsonl" if f.format == "jsonl" else "text/plain; charset=utf-8"
    return StreamingResponse(
        chunks,
        media_type=media,
        headers={
            "Content-Length": str(f.bytes),
            "Content-Disposition": content_disposition(f.filename),
        },
    )


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
    old_blob = f.blob_id
    if users:
        # Finished jobs still name this file: keep the row (marked deleted), free the bytes.
        f.deleted_at = utcnow()
        f.blob_id = None
        session.flush()
        store.delete(old_blob, session)
    else:
        session.delete(f)
        session.flush()
        store.delete(old_blob, session)
    session.commit()
    return Deleted(id=file_id, object="file")
