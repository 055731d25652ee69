"""A succeeded job's `fine-tune-results` file: a CSV of its Metric rows, one per logged step in step
order, stored like an upload (blob + File row of the job's owner, `format` "csv") and named in the
job's `result_files` (`GET /v1/files/{id}/content` serves it; the SDK reads it with
`client.files.content(job.result_files[0])`).

`write_result_file` runs inside the transaction that marks the job `succeeded` (worker.job_run's
finishing step, under the job's row lock), so the two commit together: no succeeded job without its
file, and no file when that commit fails (the blob stays incomplete and the reaper's blob gc
removes it; a retried commit writes a fresh one). A job already naming a result file gets no second
one, and a job that is not `succeeded` (cancelled while its worker finished) gets none.

The file counts toward the owner's `max_stored_bytes_per_key` like any other file, but it is written
even when the owner is over that quota: it is small (about 100 bytes a step) and part of the job's
outcome; the owner can delete it (DELETE /v1/files/{id} also takes it out of `result_files`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import RESULTS_PURPOSE, File, Job, Metric
from core.status import JobStatus
from trainer.config.metrics import STORED

if TYPE_CHECKING:
    from core.blobstore import BlobStore

FORMAT = "csv"
BATCH_ROWS = 5000  # metric rows read per query (each batch is read whole before its bytes are written)

# The CSV's columns, in order: the step, then each stored metric the registry gives a CSV column
# (trainer.config.metrics), as (header, the Metric column it holds).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("step", "step"),
    *((spec.csv, spec.name) for spec in STORED if spec.csv),
)
HEADER = tuple(header for header, _ in COLUMNS)


def result_filename(job_id: str) -> str:
    return f"{job_id}-results.csv"


def _cell(value: float | int | None) -> str:
    """Empty for no value; floats as repr (they read back exactly)."""
    if value is None:
        return ""
    return repr(float(value)) if isinstance(value, float) else str(value)


def csv_chunks(session: Session, job_id: str, batch_rows: int = BATCH_ROWS) -> Iterator[bytes]:
    """The CSV's bytes: the header, then the job's metric rows in step order, a batch at a time."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(HEADER)
    after = None
    while True:
        q = select(Metric).where(Metric.job_id == job_id)
        if after is not None:
            q = q.where(Metric.step > after)
        rows = session.scalars(q.order_by(Metric.step).limit(batch_rows)).all()
        for m in rows:
            writer.writerow([_cell(getattr(m, column)) for _, column in COLUMNS])
        yield buf.getvalue().encode()
        buf.seek(0)
        buf.truncate()
        if len(rows) < batch_rows:
            return
        after = rows[-1].step


def write_result_file(session: Session, store: BlobStore, job: Job) -> File | None:
    """Store the job's results CSV and append its File id to `job.result_files`, in `session`'s
    transaction (the caller commits it with the job's success). None when the job is not
    succeeded or already has a result file."""
    if job.status != JobStatus.SUCCEEDED or job.result_files:
        return None
    blob = store.put(csv_chunks(session, job.id), session)
    row = File(
        owner_id=job.owner_id,
        filename=result_filename(job.id),
        purpose=RESULTS_PURPOSE,
        bytes=blob.size,
        sha256=blob.sha256 or "",
        format=FORMAT,
        blob_id=blob.id,
    )
    session.add(row)
    session.flush()
    job.result_files = [row.id]
    return row
