"""A real `fromscratch worker` process on real Postgres + Redis runs jobs end to end: metrics,
checkpoints, the final model, dropped replays, lost messages re-sent, and failures that end the job
but not the worker."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import update

from core.blobstore import blobstore_from_settings
from core.models import Job, utcnow
from core.naming import checkpoint_model_id, final_model_id
from tests.fixtures.service import get_job, make_job, send_job, wait_for_status, wait_until
from tests.worker.helpers import (
    SMALL_RUN,
    assert_clean_series,
    checkpoint_rows,
    event_messages,
    extract_checkpoint,
    long_run,
    metric_rows,
)
from trainer.checkpoint import load_checkpoint


def test_job_runs_to_succeeded_with_metrics_and_checkpoints(
    service_settings, session_factory, worker_proc, tmp_path: Path
) -> None:
    job_id = make_job(service_settings, session_factory, train=SMALL_RUN)
    job = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)

    assert job.fine_tuned_model == final_model_id(job)
    assert job.step == job.total_steps == 50
    assert job.trained_tokens == 50 * 4 * 128
    assert job.lease_owner is None and job.attempts == 1
    assert job.started_at is not None and job.finished_at is not None

    rows = metric_rows(session_factory, job_id)
    assert_clean_series(rows, total_steps=50)
    evaluated = [m.step for m in rows if m.val_loss is not None]
    assert evaluated == [10, 20, 30, 40, 50]  # eval filled val_loss of the step's row (upsert)
    assert rows[-1].train_loss < rows[0].train_loss  # it learned something
    assert job.train_loss == rows[-1].train_loss and job.val_loss == rows[-1].val_loss

    ckpts = checkpoint_rows(session_factory, job_id)
    steps = [c.step for c in ckpts]
    assert steps == [20, 30, 40, 50], steps  # keep_checkpoints=3 step checkpoints + the final one
    assert [c.is_final for c in ckpts] == [False, False, False, True]
    assert all(c.model_id == checkpoint_model_id(job, c.step) for c in ckpts)
    assert ckpts[-1].metrics["step"] == 50 and ckpts[-1].metrics["valid_loss"] == rows[-1].val_loss

    store = blobstore_from_settings(service_settings, session_factory)
    final = load_checkpoint(extract_checkpoint(session_factory, store, ckpts[-1].blob_id, tmp_path))
    assert final.step == 50
    assert final.model_config.n_embd == 64 and final.tokenizer.vocab_size == 258

    messages = event_messages(session_factory, job_id)
    assert "Job status: running" in messages and messages[-1] == "Job status: succeeded"


def test_replayed_messages_are_dropped(service_settings, session_factory, worker_proc) -> None:
    from worker.runner import run_job

    job_id = make_job(service_settings, session_factory, train=long_run(250))
    wait_until(
        lambda: get_job(session_factory, job_id).step >= 5,
        timeout=120,
        message=lambda: f"the job to start training\n{worker_proc.output()}",
    )
    # a replay handled by another worker while this one runs the job: nothing happens
    assert run_job(job_id, service_settings) is None
    running = get_job(session_factory, job_id)
    assert running.status == "running" and running.attempts == 1

    done = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    events_before = event_messages(session_factory, job_id)
    # a replay of a finished job, through the broker: dropped. A second job sent after it runs,
    # which proves the worker consumed (and dropped) the replay first.
    send_job(service_settings, job_id)
    other = make_job(service_settings, session_factory, train=SMALL_RUN)
    wait_for_status(session_factory, other, "succeeded", diagnostics=worker_proc.output)
    after = get_job(session_factory, job_id)
    assert (after.status, after.attempts, after.fine_tuned_model) == ("succeeded", 1, done.fine_tuned_model)
    assert event_messages(session_factory, job_id) == events_before
    assert_clean_series(metric_rows(session_factory, job_id), total_steps=250)
    assert "dropping the message" in worker_proc.output()


def test_lost_message_is_resent_by_the_reaper(service_settings, session_factory, worker_proc) -> None:
    # The API committed the job but its message never reached the broker.
    job_id = make_job(service_settings, session_factory, train=SMALL_RUN, enqueue=False)
    with session_factory() as session:
        session.execute(
            update(Job).where(Job.id == job_id).values(updated_at=utcnow() - timedelta(minutes=5))
        )
        session.commit()
    job = wait_for_status(session_factory, job_id, "succeeded", timeout=120, diagnostics=worker_proc.output)
    assert job.attempts == 1


def test_failures_end_the_job_not_the_worker(
    service_settings, session_factory, worker_proc, tmp_path: Path
) -> None:
    # NaN loss: an absurd learning rate without gradient clipping
    diverging = make_job(
        service_settings,
        session_factory,
        train={**SMALL_RUN, "learning_rate": 1e6, "grad_clip": 0.0, "warmup_steps": 0},
    )
    # data found unusable late: far too short for one window of ctx+1 tokens
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("To be, or not to be.\n")
    too_short = make_job(service_settings, session_factory, data_path=tiny, train=SMALL_RUN)
    # too short validation data: a file of its own, or what val_fraction splits off (named as such)
    short_validation = make_job(service_settings, session_factory, validation_path=tiny, train=SMALL_RUN)
    short_split = make_job(service_settings, session_factory, train={**SMALL_RUN, "val_fraction": 1e-4})
    healthy = make_job(service_settings, session_factory, train=SMALL_RUN)

    failed = wait_for_status(session_factory, diverging, "failed", diagnostics=worker_proc.output)
    assert failed.error_code == "training_diverged"
    assert "learning rate" in failed.error_message and "nan" in failed.error_message.lower()
    assert failed.lease_owner is None

    bad_data = wait_for_status(session_factory, too_short, "failed", diagnostics=worker_proc.output)
    assert bad_data.error_code == "invalid_training_file"
    assert bad_data.error_param == "training_file"
    assert "129" in bad_data.error_message or "ctx" in bad_data.error_message  # says what is too short
    for job_id, param in ((short_validation, "validation_file"), (short_split, "val_fraction")):
        failed = wait_for_status(session_factory, job_id, "failed", diagnostics=worker_proc.output)
        assert (failed.error_code, failed.error_param) == ("invalid_training_file", param)
        assert failed.error_message.startswith("validation data has ")

    wait_for_status(session_factory, healthy, "succeeded", diagnostics=worker_proc.output)
    assert worker_proc.alive and worker_proc.starts == 1
    assert any(m.startswith("Job status: failed: ") for m in event_messages(session_factory, diverging))


def test_exceptions_map_to_user_facing_error_codes() -> None:
    import torch

    from trainer.config import ConfigError
    from trainer.data.formats import DataError
    from trainer.run.report import TrainingDiverged
    from worker.failures import classify_exception

    oom = classify_exception(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert oom.code == "out_of_memory" and "batch_size" in oom.message
    assert classify_exception(RuntimeError("DefaultCPUAllocator: out of memory")).code == "out_of_memory"
    assert classify_exception(TrainingDiverged(7, float("nan"))).code == "training_diverged"
    data = classify_exception(DataError("line 3: expected a JSON object", 3))
    assert (data.code, data.param) == ("invalid_training_file", "training_file")
    cfg = classify_exception(ConfigError([("n_embd", "must be divisible by n_head")]))
    assert (cfg.code, cfg.param) == ("invalid_hyperparameters", "n_embd")
    internal = classify_exception(KeyError("boom"))
    assert internal.code == "internal_error" and "job id" in internal.message


def test_continue_training_starts_from_the_parent_model(
    service_settings, session_factory, worker_proc
) -> None:
    parent_id = make_job(service_settings, session_factory, train=long_run(150))
    parent = wait_for_status(session_factory, parent_id, "succeeded", diagnostics=worker_proc.output)
    child_id = make_job(
        service_settings, session_factory, train=SMALL_RUN, base_model_id=parent.fine_tuned_model
    )
    child = wait_for_status(session_factory, child_id, "succeeded", diagnostics=worker_proc.output)

    assert child.fine_tuned_model == final_model_id(child)
    assert f"Starting from the weights of {parent.fine_tuned_model}" in event_messages(
        session_factory, child_id
    )
    assert (
        child.fine_tuned_model.startswith("ft:llama-tiny:")
        and child.fine_tuned_model != parent.fine_tuned_model
    )
    parent_rows, child_rows = metric_rows(session_factory, parent_id), metric_rows(session_factory, child_id)
    assert_clean_series(child_rows, total_steps=50)
    # the child starts from the parent's weights, not from scratch (fresh init is ~ln(258) = 5.55)
    assert child_rows[0].train_loss < parent_rows[0].train_loss - 1.0
    assert child_rows[0].train_loss < parent_rows[-1].train_loss + 0.5


def test_a_bpe_that_learns_fewer_tokens_sets_the_jobs_vocabulary(
    service_settings, session_factory, worker_proc, tmp_path: Path
) -> None:
    """The job's model config says the vocabulary the model has, not the one asked for: the API
    checks a prompt's token ids against it."""
    asked = 20_000  # far more than the merges ~100 kB of text holds
    train = {**SMALL_RUN, "max_steps": 2, "tokenizer": "bpe", "vocab_size": asked, "export_formats": []}
    job_id = make_job(service_settings, session_factory, train=train, model={"vocab_size": asked})
    job = wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)
    (final,) = [c for c in checkpoint_rows(session_factory, job_id) if c.is_final]
    store = blobstore_from_settings(service_settings, session_factory)
    learned = load_checkpoint(extract_checkpoint(session_factory, store, final.blob_id, tmp_path)).tokenizer
    assert learned.vocab_size < asked
    assert job.model_config["vocab_size"] == learned.vocab_size
    assert job.train_config["vocab_size"] == asked  # what was asked stays in the training config
