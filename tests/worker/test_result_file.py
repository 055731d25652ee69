"""The results CSV of a succeeded job (worker/result_file.py) on PostgreSQL and SQLite: its exact
header, one row per Metric row in step order (read in batches), written once, only for a succeeded
job, in the caller's transaction (a rollback leaves no file); and the event levels every writer uses."""

from __future__ import annotations

import ast
import csv
import io
import secrets
from pathlib import Path
from typing import Any, get_args

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from core.blobstore import BlobStore
from core.job_leases import claim_job
from core.jobstates import EVENT_LEVELS, add_event, transition
from core.models import Blob, File, Job, Metric
from core.quotas import stored_bytes
from worker.result_file import HEADER, csv_chunks, write_result_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["postgres", "sqlite"])
def any_factory(request: pytest.FixtureRequest) -> sessionmaker[Session]:
    return request.getfixturevalue(
        "session_factory" if request.param == "postgres" else "sqlite_session_factory"
    )


def _job(sf: sessionmaker[Session], steps: list[int], owner: str | None = None) -> str:
    """A running job held by worker w1 (of a new owner unless given), with metric rows at `steps`
    (every third one evaluated)."""
    store = BlobStore(sf)
    owner = owner or f"owner-{secrets.token_hex(6)}"
    with sf() as s:
        blob = store.put([b"hello world\n"], s)
        f = File(
            owner_id=owner,
            filename="t.txt",
            purpose="fine-tune",
            bytes=blob.size,
            sha256=blob.sha256 or "",
            format="text",
            blob_id=blob.id,
        )
        s.add(f)
        s.flush()
        job = Job(owner_id=owner, model="llama-tiny", training_file=f.id, status="queued", seed=1)
        s.add(job)
        s.commit()
        job_id = job.id
        claim_job(s, job_id, "w1", 30)
        transition(s, s.get(Job, job_id), "running")
        for step in steps:
            s.add(
                Metric(
                    job_id=job_id,
                    step=step,
                    train_loss=3.0 - step / 1000,
                    val_loss=(3.1 - step / 1000) if step % 3 == 0 else None,
                    train_accuracy=step / 1000,
                    val_accuracy=(0.5 + step / 1000) if step % 3 == 0 else None,
                    lr=1e-3 * step,
                    tokens_per_s=512.25,
                    grad_norm=0.5,
                    tokens_seen=64 * step,
                )
            )
        s.commit()
    return job_id


def _read_csv(store: BlobStore, file_id: str, sf: sessionmaker[Session]) -> list[list[str]]:
    with sf() as s:
        f = s.get(File, file_id)
        assert f is not None and f.blob_id is not None
        blob_id = f.blob_id
    return list(csv.reader(io.StringIO(b"".join(store.open(blob_id)).decode())))


def _succeed(sf: sessionmaker[Session], store: BlobStore, job_id: str) -> File | None:
    """What the worker's finishing transaction does: succeeded, then the file, one commit."""
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None
        transition(s, job, "succeeded", fine_tuned_model="ft:x")
        row = write_result_file(s, store, job)
        s.commit()
        return row


def test_csv_has_the_header_and_a_row_per_metric_row(any_factory: sessionmaker[Session]) -> None:
    store = BlobStore(any_factory)
    steps = [1, 2, 3, 5, 8, 13, 21]
    job_id = _job(any_factory, steps)
    row = _succeed(any_factory, store, job_id)
    assert row is not None
    assert (row.purpose, row.format, row.filename) == ("fine-tune-results", "csv", f"{job_id}-results.csv")
    with any_factory() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.result_files == [row.id] and job.status == "succeeded"
        assert row.owner_id == job.owner_id
    lines = _read_csv(store, row.id, any_factory)
    assert lines[0] == [
        "step",
        "train_loss",
        "train_accuracy",
        "valid_loss",
        "valid_mean_token_accuracy",
        "learning_rate",
        "tokens_per_s",
        "grad_norm",
        "tokens_seen",
        "peak_memory_bytes",
    ]
    assert list(HEADER) == lines[0]
    assert [int(r[0]) for r in lines[1:]] == steps
    for r, step in zip(lines[1:], steps, strict=True):
        assert float(r[1]) == 3.0 - step / 1000
        assert r[2] == repr(step / 1000)  # train_accuracy <- Metric.train_accuracy
        assert r[4] == (repr(0.5 + step / 1000) if step % 3 == 0 else "")  # <- Metric.val_accuracy
        assert r[3] == (repr(3.1 - step / 1000) if step % 3 == 0 else "")
        assert float(r[5]) == 1e-3 * step and float(r[6]) == 512.25
        assert float(r[7]) == 0.5 and int(r[8]) == 64 * step and r[9] == ""  # no peak memory measured


def test_rows_are_read_in_batches_in_step_order(any_factory: sessionmaker[Session]) -> None:
    job_id = _job(any_factory, [10, 2, 7, 4, 9, 1, 3])  # inserted out of order
    with any_factory() as s:
        chunks = list(csv_chunks(s, job_id, batch_rows=3))
    assert len(chunks) == 3  # 3 + 3 + 1 rows (the header rides with the first batch)
    lines = b"".join(chunks).decode().splitlines()
    assert [int(line.split(",")[0]) for line in lines[1:]] == [1, 2, 3, 4, 7, 9, 10]


def test_written_once_only_when_succeeded_and_with_the_commit(any_factory: sessionmaker[Session]) -> None:
    store = BlobStore(any_factory)
    job_id = _job(any_factory, [1, 2])
    with any_factory() as s:  # still running: no file
        job = s.get(Job, job_id)
        assert job is not None and write_result_file(s, store, job) is None
    with any_factory() as s:  # the success commit fails: neither the file nor a complete blob stays
        files_before = s.scalar(select(func.count()).select_from(File))
        job = s.get(Job, job_id)
        assert job is not None
        transition(s, job, "succeeded")
        assert write_result_file(s, store, job) is not None
        s.rollback()
        assert s.scalar(select(func.count()).select_from(File)) == files_before
        assert s.get(Job, job_id).status == "running"  # type: ignore[union-attr]
    first = _succeed(any_factory, store, job_id)
    assert first is not None
    with any_factory() as s:  # a second call (a retried finishing step) adds nothing
        job = s.get(Job, job_id)
        assert job is not None and write_result_file(s, store, job) is None
        assert job.result_files == [first.id]
        assert s.scalar(select(func.count()).select_from(File).where(File.owner_id == job.owner_id)) == 2


def test_no_file_for_a_job_cancelled_while_its_worker_finished(any_factory: sessionmaker[Session]) -> None:
    from core.jobstates import request_cancel

    store = BlobStore(any_factory)
    job_id = _job(any_factory, [1, 2, 3])
    with any_factory() as s:
        job = s.get(Job, job_id)
        assert job is not None
        request_cancel(s, job)
        s.commit()
    assert _succeed(any_factory, store, job_id) is None
    with any_factory() as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.status, job.result_files, job.lease_owner) == ("cancelled", [], None)


def test_counted_in_the_owners_stored_bytes(session_factory: sessionmaker[Session]) -> None:
    store = BlobStore(session_factory)
    owner = f"owner-{secrets.token_hex(6)}"
    job_id = _job(session_factory, list(range(1, 40)), owner=owner)
    with session_factory() as s:
        before = stored_bytes(s, owner)
    row = _succeed(session_factory, store, job_id)  # no quota is checked: a small part of the outcome
    assert row is not None
    with session_factory() as s:
        assert stored_bytes(s, owner) == before + row.bytes
        blob = s.get(Blob, row.blob_id)
        assert blob is not None and blob.complete and blob.size == row.bytes


# ------------------------------------------------------------------------------------ event levels
def test_add_event_refuses_other_levels(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, pytest.raises(ValueError, match="warning"):
        add_event(s, "ftjob-x", "hello", level="warning")  # type: ignore[arg-type]


def test_event_levels_are_the_sdks(session_factory: sessionmaker[Session]) -> None:
    from openai.types.fine_tuning import FineTuningJobEvent

    from api.schemas import JobEvent

    sdk_levels = set(get_args(FineTuningJobEvent.model_fields["level"].annotation))
    assert EVENT_LEVELS == sdk_levels == set(get_args(JobEvent.model_fields["level"].annotation))


def _calls_writing_events(tree: ast.AST) -> list[ast.Call]:
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("add_event", "Event"):
                calls.append(node)
    return calls


def test_every_event_writer_uses_a_known_level() -> None:
    """Every add_event(...) / Event(...) call of the service passes its level as one of
    EVENT_LEVELS (a literal, or a value typed EventLevel: the status events), or none."""
    seen = 0
    for path in [p for part in ("api", "core", "worker") for p in (REPO / part).rglob("*.py")]:
        tree = ast.parse(path.read_text(), str(path))
        for call in _calls_writing_events(tree):
            level: Any = next((k.value for k in call.keywords if k.arg == "level"), None)
            if level is None:
                continue
            seen += 1
            where = f"{path.relative_to(REPO)}:{call.lineno}"
            if isinstance(level, ast.Constant):
                assert level.value in EVENT_LEVELS, f"{where}: level {level.value!r}"
            else:  # a variable: only the state machine's typed ones (mypy checks their type)
                assert path.name == "jobstates.py" and isinstance(level, ast.Name), where
    assert seen >= 3  # the reaper's re-queue, the database give-up, the checkpoint quota warnings
