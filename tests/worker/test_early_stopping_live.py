"""Stopping at the best through the service: a real worker trains a job whose validation loss rises;
the job stops after `early_stopping_patience` evaluations, succeeds, says which checkpoint is its
model in an event, and its model (the weights behind its fine-tuned model id, its downloads and
the exports made at its end) is the best evaluation's, while the last step's checkpoint stays
listed. The same run in this process is the reference for the tensors. An attempt that resumes in
a fresh folder (another worker, after a pause) gets the best checkpoint back from the store.

The data: the start of tiny Shakespeare, then digits, which are the last tenth of the file and so
its validation split. Learning English helps on digits at first, then hurts: the validation loss
falls until step 10 and rises after it."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from core.archives import extract_all
from core.blobstore import blobstore_from_settings
from core.job_leases import claim_job
from core.settings import Settings
from tests.fixtures.service import ServiceProcess, make_job, wait_for_status
from tests.trainer.conftest import SHAKESPEARE
from tests.trainer.test_cli_exports import onnx_logits_match_checkpoint
from tests.worker.helpers import checkpoint_rows, event_messages, metric_rows
from tests.worker.test_final_exports import download, owner_of
from trainer.config import TrainConfig, model_config_from_preset
from trainer.run.loop import TrainResult, train
from worker.callbacks import ServiceCallbacks
from worker.checkpoint_restore import latest_checkpoint, restore_best

MODEL = dict(n_layer=1, n_head=2, n_kv_head=2, n_embd=32, ctx=32)
# checkpoints every 4 steps, one kept: the best (step 10) is between two, and rotation must keep it
RUN = dict(
    max_steps=40,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=2,
    eval_every=2,
    eval_batches=2,
    checkpoint_every=4,
    keep_checkpoints=1,
    early_stopping_patience=3,
    dropout=0.0,  # the curve the steps above were read from (auto would decide from the data)
    export_formats=["onnx"],
    dtype="float32",
)


def reference(data: Path, out: Path) -> TrainResult:
    """The run in this process, uninterrupted."""
    model_cfg = model_config_from_preset("llama-tiny", **MODEL)
    result = train(model_cfg, TrainConfig(device="cpu", seed=1337, **RUN), data, out)
    assert (result.stop_reason, result.step, result.best_step) == ("early_stop", 16, 10)
    return result


def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "english-then-digits.txt"
    path.write_text(SHAKESPEARE.read_text()[:18_000] + "0123456789" * 200)
    return path


def untar(content: bytes, dest: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(content)) as tf:
        extract_all(tf, dest)
    [folder] = [p.parent for p in dest.rglob("model.safetensors")]
    return folder


def assert_same_tensors(a: Path, b: Path) -> None:
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert ta.keys() == tb.keys()
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key


def test_an_early_stopped_jobs_model_is_its_best_checkpoint(
    settings: Settings, session_factory: Any, worker_proc: ServiceProcess, live_server: Any, tmp_path: Path
) -> None:
    data = data_file(tmp_path)
    owner = owner_of(session_factory, live_server.api_key)
    job_id = make_job(settings, session_factory, owner_id=owner, data_path=data, model=MODEL, train=RUN)
    job = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)

    ref = reference(data, tmp_path / "ref")  # its best/ and its last step are the expected tensors
    assert job.step == ref.step

    losses = {m.step: m.val_loss for m in metric_rows(session_factory, job_id) if m.val_loss is not None}
    assert min(losses, key=lambda s: losses[s]) == 10 and max(losses) == 16
    note = (
        f"Validation loss has not improved for 3 evaluations since step 10 ({losses[10]:.3f}); stopping; "
        "the model is the step-10 checkpoint. To train longer, raise early_stopping_patience (0 = off)."
    )
    messages = event_messages(session_factory, job_id)
    assert note in messages and messages[-1] == "Job status: succeeded"  # the end comes last
    # the checkpoint event tells best/'s snapshots (one per new best) from the step checkpoints
    new_bests = sum(
        losses[s] < min([losses[t] for t in losses if t < s], default=float("inf")) for s in losses
    )
    assert ref.checkpoint_times.weights_only == new_bests >= 2
    kinds = f"({ref.checkpoint_times.resumable} step checkpoints, {new_bests} best-model snapshots (best/))"
    assert any(m.startswith("Checkpoints in the background") and kinds in m for m in messages), messages

    # the model is the step-10 checkpoint, the final one; the last step's stays listed beside it
    rows = {c.step: c for c in checkpoint_rows(session_factory, job_id)}
    assert sorted(rows) == [10, 16] and rows[10].is_final and not rows[16].is_final
    assert rows[10].metrics["valid_loss"] == losses[10]
    assert rows[10].metrics["full_valid_loss"] is not None  # the full pass measured the model

    model_id = job.fine_tuned_model
    got = download(live_server, model_id, "checkpoint")
    assert got.status_code == 200, got.text
    model = untar(got.content, tmp_path / "model")
    assert_same_tensors(model, tmp_path / "ref" / "best")
    last = download(live_server, rows[16].model_id, "checkpoint")
    assert last.status_code == 200, last.text
    assert_same_tensors(
        untar(last.content, tmp_path / "last"), tmp_path / "ref" / "checkpoints" / "step-00000016"
    )

    # the export made at the job's end is of the model
    onnx = download(live_server, model_id, "onnx")
    assert onnx.status_code == 200, onnx.text
    (tmp_path / "model.onnx").write_bytes(onnx.content)
    onnx_logits_match_checkpoint(tmp_path / "model.onnx", tmp_path / "ref" / "best")


class PauseAfter(ServiceCallbacks):
    """The worker's callbacks, pausing the run after `step` (as a pause request would)."""

    def __init__(self, step: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pause_after, self.last_step = step, 0

    def on_step(self, metrics: Any) -> None:
        super().on_step(metrics)
        self.last_step = metrics.step

    def should_stop(self) -> Any:
        return "pause" if self.last_step >= self.pause_after else super().should_stop()


def test_a_resumed_attempt_gets_its_best_checkpoint_back(
    settings: Settings, session_factory: Any, tmp_path: Path
) -> None:
    data = data_file(tmp_path)
    ref = reference(data, tmp_path / "ref")
    worker = "host:1:early-stopping-test"
    job_id = make_job(
        settings, session_factory, data_path=data, model=MODEL, train=RUN, enqueue=False, status="queued"
    )
    with session_factory() as session:
        assert claim_job(session, job_id, worker, lease_seconds=600) is not None
    store = blobstore_from_settings(settings, session_factory)
    callbacks = PauseAfter(
        12,  # past the best (10): its step checkpoint is stored with the best's
        session_factory,
        store,
        job_id=job_id,
        worker_id=worker,
        checkpoint_model_id=lambda step: f"ft:test:{job_id}:ckpt-step-{step}",
        scratch=tmp_path / "first",
        keep_checkpoints=1,
        db_retry_seconds=5.0,
    )
    model_cfg = model_config_from_preset("llama-tiny", **MODEL)
    cfg = TrainConfig(device="cpu", seed=1337, **RUN)
    first = train(model_cfg, cfg, data, tmp_path / "first" / "run", callbacks)
    callbacks.wait_for_uploads()  # as worker.job_run does: the checkpoints upload in the background
    callbacks.flush(wait=True)
    assert (first.stop_reason, first.step) == ("pause", 12)
    assert [c.step for c in checkpoint_rows(session_factory, job_id)] == [10, 12]  # rotation kept the best

    # the next attempt, in a folder of its own, as worker.job_inputs.prepare_inputs sets it up
    resume, step = latest_checkpoint(session_factory, store, job_id, tmp_path / "second" / "resume")
    assert resume is not None and step == 12
    restore_best(session_factory, store, job_id, resume, tmp_path / "second" / "run")
    best_blob = next(c.blob_id for c in checkpoint_rows(session_factory, job_id) if c.step == 10)
    resumed_callbacks = PauseAfter(
        10**6,  # never: the run ends by early stopping, storing its step checkpoints on the way
        session_factory,
        store,
        job_id=job_id,
        worker_id=worker,
        checkpoint_model_id=lambda step: f"ft:test:{job_id}:ckpt-step-{step}",
        scratch=tmp_path / "second",
        keep_checkpoints=1,
        db_retry_seconds=5.0,
    )
    second = train(model_cfg, cfg, data, tmp_path / "second" / "run", resumed_callbacks, resume=resume)
    resumed_callbacks.wait_for_uploads()
    resumed_callbacks.flush(wait=True)
    assert (second.stop_reason, second.step, second.model_step) == ("early_stop", 16, 10)
    # the best the first attempt stored is kept as it was, not uploaded a second time
    assert [c.step for c in checkpoint_rows(session_factory, job_id)] == [10, 16]
    assert next(c.blob_id for c in checkpoint_rows(session_factory, job_id) if c.step == 10) == best_blob
    assert second.model_note == ref.model_note
    assert_same_tensors(tmp_path / "second" / "run" / "final", tmp_path / "ref" / "best")
