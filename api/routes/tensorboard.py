"""GET /v1/fine_tuning/jobs/{id}/tensorboard: the job's metrics as a TensorBoard log folder, in a
tar (`<job id>/events.out.tfevents.<created>.fromscratch`): `tar xf` it and point
`tensorboard --logdir` at the folder, or load it with TensorBoard's EventAccumulator.

Rendered on each request from the job's Metric rows (api/tensorboard_events.py), not written by
the worker during training: it is always as current as GET /metrics (a running job too), it
agrees with the Metric rows after a resume dropped and re-logged steps (event files written
during training would hold those steps twice), it costs no storage or quota, and jobs trained
before this endpoint have one as well. Each row's wall time is when the worker wrote it.
"""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Iterator
from typing import IO

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from api.deps import CurrentKey, SessionDep
from api.queries import owned_job
from api.schemas import unix_float
from api.tensorboard_events import event_records
from core.models import Metric

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])
SPOOL_BYTES = 8 << 20  # larger event files go to a temporary file
CHUNK = 1 << 16
BLOCK = tarfile.BLOCKSIZE


@router.get(
    "/jobs/{job_id}/tensorboard",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}}},
    summary="The job's metrics as TensorBoard event files (a tar)",
)
def download_tensorboard(job_id: str, session: SessionDep, key: CurrentKey) -> StreamingResponse:
    job = owned_job(session, key.owner_id, job_id)
    created = unix_float(job.created_at) or 0.0
    rows = session.scalars(
        select(Metric).where(Metric.job_id == job.id).order_by(Metric.step).execution_options(yield_per=1000)
    )
    events = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # closed by _tar
    for chunk in event_records(((m, unix_float(m.created_at) or created) for m in rows), created):
        events.write(chunk)
    size = events.tell()
    events.seek(0)
    info = tarfile.TarInfo(f"{job.id}/events.out.tfevents.{int(created)}.fromscratch")
    info.size, info.mtime, info.mode = size, int(created), 0o644
    return StreamingResponse(
        _tar(info, events),
        media_type="application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{job.id}-tensorboard.tar"'},
    )


def _tar(info: tarfile.TarInfo, content: IO[bytes]) -> Iterator[bytes]:
    """A tar of one file, streamed: its header, its content padded to a block, the end marker."""
    try:
        yield info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
        while chunk := content.read(CHUNK):
            yield chunk
        yield b"\0" * (-info.size % BLOCK) + b"\0" * (2 * BLOCK)
    finally:
        content.close()
