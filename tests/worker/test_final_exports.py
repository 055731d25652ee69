"""The exports a job asked for (`export_formats`) are made by the training worker before the job is
marked succeeded, so their downloads answer 200 at once while no inference worker runs; any other
format is made on demand (202, then 200 from an inference worker).

worker.final_exports.store_final_exports is also called directly (the step of JobEnding.succeed) on
a real checkpoint folder and a job row this "worker" holds: rows and files, a retried attempt
replacing them, the storage quota, a format the model cannot be exported as, a lost lease."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from core.archives import extract_all
from core.blobstore import BlobStore, blobstore_from_settings
from core.exports import export_folder_name
from core.models import Blob, Event, Export, Job
from core.naming import final_model_id
from core.quotas import stored_bytes
from core.settings import Settings
from tests.api.test_model_downloads import assert_preparing, poll, start_inference_worker
from tests.fixtures.service import ServiceProcess, make_job, wait_for_status
from tests.trainer.test_cli_exports import onnx_logits_match_checkpoint
from worker.db_retry import DbRetry
from worker.final_exports import store_final_exports
from worker.job_inputs import JobSnapshot
from worker.lease import LeaseLost

RUN = dict(max_steps=6, batch_size=4, checkpoint_every=0, eval_every=0, warmup_steps=1)
WORKER_ID = "worker-final-exports-test"


# ------------------------------------------------------------------------------- the step itself
@dataclass
class Finishing:
    """What JobRun hands store_final_exports (worker.final_exports.FinishingJob)."""

    job_id: str
    settings: Settings
    sf: Any
    store: BlobStore
    job_dir: Path
    worker_id: str = WORKER_ID
    db: DbRetry = field(default_factory=lambda: DbRetry("test"))


def held_job(
    settings: Settings, session_factory: Any, tmp_path: Path, rope_dims: int | None = None, **train: Any
) -> tuple[Finishing, Any]:
    """A running job held by WORKER_ID, its snapshot, and a real final checkpoint folder."""
    import torch

    from trainer.checkpoint import save_checkpoint
    from trainer.config import ModelConfig, TrainConfig
    from trainer.data.tokenizers import ByteTokenizer
    from trainer.model.llama import Llama

    job_id = make_job(
        settings,
        session_factory,
        owner_id=f"owner-{tmp_path.name[-12:]}",
        train=train,
        enqueue=False,
        status="running",
    )
    with session_factory() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.lease_owner = WORKER_ID
        s.commit()
        snapshot = JobSnapshot.of(job, s)
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, ctx=32, vocab_size=258, rope_dims=rope_dims)
    save_checkpoint(
        tmp_path / "final",
        model=Llama(cfg),
        model_config=cfg,
        train_config=TrainConfig(),
        tokenizer=ByteTokenizer(),
        state={"step": 6, "tokens_seen": 0, "best_val_loss": None, "sampler": {}, "total_steps": 6},
    )
    store = blobstore_from_settings(settings, session_factory)
    return Finishing(job_id, settings, session_factory, store, tmp_path / "job"), snapshot


def rows(session_factory: Any, model_id: str) -> dict[str, Export]:
    with session_factory() as s:
        found = {r.format: r for r in s.scalars(select(Export).where(Export.model_id == model_id))}
        s.expunge_all()
        return found


def warnings(session_factory: Any, job_id: str) -> list[Event]:
    with session_factory() as s:
        # in the order they were written (without an ORDER BY, PostgreSQL may answer in any order)
        query = select(Event).where(Event.job_id == job_id, Event.level == "warn").order_by(Event.seq)
        found = list(s.scalars(query))
        s.expunge_all()
        return found


def blob_bytes(store: BlobStore, blob_id: str) -> bytes:
    return b"".join(store.open(blob_id))


def test_stored_ready_and_a_retried_attempt_replaces_them(
    settings: Settings, session_factory: Any, tmp_path: Path
) -> None:
    run, snapshot = held_job(settings, session_factory, tmp_path)  # the default: gguf, hf
    model_id = final_model_id(snapshot.naming_job)
    store_final_exports(run, snapshot, tmp_path / "final")
    first = rows(session_factory, model_id)
    assert sorted(first) == ["gguf", "hf"]
    for fmt, row in first.items():
        assert row.status == "ready" and row.owner_id == snapshot.owner_id and row.blob_id, (fmt, row)
    safe = model_id.replace(":", "-")
    assert (first["gguf"].filename, first["hf"].filename) == (f"{safe}.gguf", f"{safe}-hf.tar")
    assert blob_bytes(run.store, first["gguf"].blob_id)[:4] == b"GGUF"  # type: ignore[arg-type]
    with tarfile.open(fileobj=io.BytesIO(blob_bytes(run.store, first["hf"].blob_id))) as tf:  # type: ignore[arg-type]
        names = tf.getnames()
    assert f"{export_folder_name(model_id, 'hf', 'f32')}/config.json" in names
    assert not (run.job_dir / "final-exports").exists()  # scratch cleaned

    store_final_exports(run, snapshot, tmp_path / "final")  # the attempt again (after a crash)
    second = rows(session_factory, model_id)
    assert {f: r.id for f, r in second.items()} == {f: r.id for f, r in first.items()}  # the same rows
    old_blobs = [r.blob_id for r in first.values()]
    assert all(second[f].blob_id != first[f].blob_id for f in first)  # this attempt's files
    with session_factory() as s:
        assert s.scalars(select(Blob.id).where(Blob.id.in_(old_blobs))).all() == []
    assert warnings(session_factory, run.job_id) == []


def test_over_the_storage_quota_each_is_skipped_with_a_warning(
    settings: Settings, session_factory: Any, tmp_path: Path
) -> None:
    run, snapshot = held_job(settings, session_factory, tmp_path, export_formats=["gguf", "onnx"])
    with session_factory() as s:
        used = stored_bytes(s, snapshot.owner_id)
        blobs = s.scalars(select(Blob.id)).all()
    run.settings = settings.model_copy(update={"max_stored_bytes_per_key": used + 100})
    store_final_exports(run, snapshot, tmp_path / "final")
    assert rows(session_factory, final_model_id(snapshot.naming_job)) == {}
    warned = warnings(session_factory, run.job_id)
    assert [(e.data or {}).get("export") for e in warned] == ["gguf", "onnx"]
    assert all((e.data or {}).get("quota") == "max_stored_bytes_per_key" for e in warned)
    assert "storage quota" in warned[0].message and "on first download" in warned[0].message
    with session_factory() as s:
        assert sorted(s.scalars(select(Blob.id)).all()) == sorted(blobs)  # nothing kept


def test_a_format_the_model_cannot_be_exported_as_is_a_warning(
    settings: Settings, session_factory: Any, tmp_path: Path
) -> None:
    run, snapshot = held_job(settings, session_factory, tmp_path, export_formats=["hf", "gguf"], rope_dims=8)
    store_final_exports(run, snapshot, tmp_path / "final")
    assert sorted(rows(session_factory, final_model_id(snapshot.naming_job))) == ["gguf"]
    [warned] = warnings(session_factory, run.job_id)
    assert "hf export was not made" in warned.message and "partial" in warned.message.lower(), warned.message


def test_a_lost_lease_stores_nothing(settings: Settings, session_factory: Any, tmp_path: Path) -> None:
    run, snapshot = held_job(settings, session_factory, tmp_path, export_formats=["gguf"])
    run.worker_id = "someone-else"
    with session_factory() as s:
        blobs = s.scalars(select(Blob.id)).all()
    with pytest.raises(LeaseLost):
        store_final_exports(run, snapshot, tmp_path / "final")
    assert rows(session_factory, final_model_id(snapshot.naming_job)) == {}
    with session_factory() as s:
        assert sorted(s.scalars(select(Blob.id)).all()) == sorted(blobs)


# ------------------------------------------------------------------------------- through the service
def owner_of(session_factory: Any, secret: str) -> str:
    from core.keys import verify_key

    with session_factory() as s:
        key = verify_key(s, secret)
        assert key is not None
        return str(key.owner_id)


def download(server: Any, model_id: str, fmt: str, dtype: str = "f32") -> httpx.Response:
    return httpx.get(
        f"{server.url}/v1/models/{model_id}/content",
        params={"format": fmt, "dtype": dtype},
        headers=server.headers(),
        timeout=60,
    )


def test_a_finished_jobs_exports_are_ready_at_once(
    settings: Settings,
    session_factory: Any,
    worker_proc: ServiceProcess,
    live_server: Any,
    tmp_path: Path,
) -> None:
    owner = owner_of(session_factory, live_server.api_key)
    job_id = make_job(settings, session_factory, owner_id=owner, train=RUN)
    job = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    model_id = job.fine_tuned_model
    stored = rows(session_factory, model_id)
    assert sorted(stored) == ["gguf", "hf"] and all(r.status == "ready" for r in stored.values())

    # no inference worker runs: these were made by the training worker
    gguf = download(live_server, model_id, "gguf")
    assert gguf.status_code == 200 and gguf.content[:4] == b"GGUF", gguf.text
    hf = download(live_server, model_id, "hf")
    assert hf.status_code == 200, hf.text
    with tarfile.open(fileobj=io.BytesIO(hf.content)) as tf:
        config = tf.extractfile(f"{export_folder_name(model_id, 'hf', 'f32')}/config.json")
        assert config is not None and json.load(config)["architectures"] == ["LlamaForCausalLM"]

    # the others are made on demand by an inference worker
    assert_preparing(download(live_server, model_id, "onnx"), model_id, "onnx")
    assert_preparing(download(live_server, model_id, "gguf", "f16"), model_id, "gguf", "f16")
    worker = start_inference_worker(live_server.settings, tmp_path)
    try:
        onnx = poll(lambda: download(live_server, model_id, "onnx"), worker)
        f16 = poll(lambda: download(live_server, model_id, "gguf", "f16"), worker)
    finally:
        worker.stop()
    assert onnx.status_code == 200, onnx.text
    assert f16.status_code == 200 and f16.content[:4] == b"GGUF", f16.text
    assert len(f16.content) < len(gguf.content)
    ckpt = httpx.get(
        f"{live_server.url}/v1/models/{model_id}/content",
        params={"format": "checkpoint"},
        headers=live_server.headers(),
        timeout=60,
    )
    with tarfile.open(fileobj=io.BytesIO(ckpt.content)) as tf:
        extract_all(tf, tmp_path / "ckpt")
    (tmp_path / "m.onnx").write_bytes(onnx.content)
    [folder] = [p.parent for p in (tmp_path / "ckpt").rglob("model.safetensors")]
    onnx_logits_match_checkpoint(tmp_path / "m.onnx", folder)


def test_no_export_formats_means_on_demand(
    settings: Settings,
    session_factory: Any,
    worker_proc: ServiceProcess,
    inference_worker: ServiceProcess,
    live_server: Any,
) -> None:
    owner = owner_of(session_factory, live_server.api_key)
    job_id = make_job(settings, session_factory, owner_id=owner, train={**RUN, "export_formats": []})
    model_id = wait_for_status(
        session_factory, job_id, "succeeded", diagnostics=worker_proc.output
    ).fine_tuned_model
    assert rows(session_factory, model_id) == {}
    assert_preparing(download(live_server, model_id, "gguf"), model_id, "gguf")
    r = poll(lambda: download(live_server, model_id, "gguf"), inference_worker)
    assert r.status_code == 200 and r.content[:4] == b"GGUF", r.text
