"""What a claimed job trains on: `JobSnapshot` (the job row's inputs, read once) and
`prepare_inputs`, which brings files, configs, the starting checkpoint, tokenizer and tokens onto
this worker's disk (steps 3 and 4 of worker.runner's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from core.models import File, Job
from trainer.config import ModelConfig, TrainConfig
from worker.checkpoint_restore import base_model_checkpoint, latest_checkpoint, restore_best
from worker.data_cache import fetch_file, job_tokenizer, prepare_tokens, tokenizer_of

if TYPE_CHECKING:
    from core.blobstore import BlobStore
    from trainer.data.prepare import TokenData
    from trainer.data.tokenizers import Tokenizer


@dataclass
class JobSnapshot:
    """The job's inputs, read once (plain values, safe after the session closed)."""

    owner_id: str
    training_file: str
    training_sha256: str
    validation_file: str | None
    model_config: dict[str, Any]
    train_config: dict[str, Any]
    seed: int
    base_model_id: str | None
    queue: str
    keep_checkpoints: int | None
    naming_job: Job  # the job row, detached from its session, for core.naming

    @classmethod
    def of(cls, job: Job, session: Session) -> JobSnapshot:
        file = session.get(File, job.training_file)
        sha = file.sha256 if file is not None else ""
        session.expunge(job)
        return cls(
            owner_id=job.owner_id,
            training_file=job.training_file,
            training_sha256=sha,
            validation_file=job.validation_file,
            model_config=dict(job.model_config or {}),
            train_config=dict(job.train_config or {}),
            seed=int(job.seed),
            base_model_id=job.base_model_id,
            queue=job.queue,
            keep_checkpoints=(job.train_config or {}).get(
                "keep_checkpoints", TrainConfig.model_fields["keep_checkpoints"].default
            ),
            naming_job=job,
        )


@dataclass
class TrainingInputs:
    """The arguments of trainer.run.loop.train for this job, on this worker's disk."""

    model_cfg: ModelConfig
    train_cfg: TrainConfig
    data: TokenData
    tokenizer: Tokenizer
    resume_path: Path | None  # the job's newest stored checkpoint (None: a fresh start)
    resume_step: int  # its step (0 without one)
    init_from: Path | None  # the base model's final checkpoint ("continue training"), for a fresh start
    train_path: Path  # the files `data` was tokenized from (a distributed run's ranks read them)
    val_path: Path | None


def prepare_inputs(
    session_factory: sessionmaker[Session],
    store: BlobStore,
    *,
    job_id: str,
    snapshot: JobSnapshot,
    cache_dir: Path,
    job_dir: Path,
    device_setting: str,
) -> TrainingInputs:
    """Download (and validate) the files, build the configs, extract the checkpoint to start from,
    and get the tokenizer and tokens (from the cache when this content was prepared before)."""
    train_path = fetch_file(session_factory, store, cache_dir, snapshot.training_file, "training_file")
    val_path = None
    if snapshot.validation_file:
        val_path = fetch_file(session_factory, store, cache_dir, snapshot.validation_file, "validation_file")
    model_cfg, train_cfg = job_configs(snapshot, device_setting)

    resume_path, resume_step = latest_checkpoint(session_factory, store, job_id, job_dir / "resume")
    if resume_path is not None:  # the run's folder is job_dir/run (worker.job_run)
        restore_best(session_factory, store, job_id, resume_path, job_dir / "run")
    init_from = None
    if resume_path is None and snapshot.base_model_id:
        init_from = base_model_checkpoint(
            session_factory, store, snapshot.base_model_id, snapshot.owner_id, job_dir / "parent"
        )

    # a checkpoint brings its own tokenizer; a fresh start trains one (or finds it cached)
    if resume_path is not None:
        tokenizer = tokenizer_of(resume_path)
    elif init_from is not None:
        tokenizer = tokenizer_of(init_from)
    else:
        tokenizer = job_tokenizer(cache_dir, train_path, snapshot.training_sha256, train_cfg)
    data = prepare_tokens(cache_dir, train_path, val_path, tokenizer, train_cfg)
    return TrainingInputs(
        model_cfg, train_cfg, data, tokenizer, resume_path, resume_step, init_from, train_path, val_path
    )


def job_configs(snapshot: JobSnapshot, device_setting: str) -> tuple[ModelConfig, TrainConfig]:
    """The job's configs, with the job's seed, on the device this worker is set to use."""
    model_cfg = ModelConfig.from_dict(snapshot.model_config)
    train_cfg = TrainConfig.from_dict({**snapshot.train_config, "seed": snapshot.seed})
    device = worker_device(device_setting)
    if train_cfg.device == "auto" and device is not None:
        train_cfg = TrainConfig.from_dict({**train_cfg.to_dict(), "device": device})
    return model_cfg, train_cfg


def worker_device(setting: str) -> str | None:
    """The TrainConfig.device a worker's `device` setting means for jobs that left it "auto"
    (None: let the trainer choose). `cuda:N` pins this worker process to GPU N."""
    if setting in ("cpu", "cuda"):
        return setting
    if setting.startswith("cuda:"):
        import torch

        torch.cuda.set_device(int(setting.split(":", 1)[1]))
        return "cuda"
    return None  # "auto", or a device the trainer does not know (it picks cuda when available)
