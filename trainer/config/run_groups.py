"""TrainConfig's groups about how a run is carried out: evaluation and early stopping, checkpoints
and exports, and the runtime (devices, precision, limits, logging); trainer.config.train composes them."""

from __future__ import annotations

from typing import Annotated, Literal

from trainer.config.export_formats import FINAL_DEFAULT, ExportFormat
from trainer.config.fields import Distinct, Int, StrictConfig, param
from trainer.config.learning_groups import MAX_STEPS


class EvaluationFields(StrictConfig):
    """The validation data and how often it is measured."""

    val_fraction: float = param(
        0.1,
        "fraction of the tokens (the last ones) held out for validation",
        title="Validation fraction",
        ge=0,
        lt=1,
    )
    eval_every: Int | None = param(
        None,
        "evaluate the validation loss every N steps (0 disables)",
        title="Eval every",
        ge=0,
        le=MAX_STEPS,
        advanced=False,
        null_means="auto: 20 evaluations over the run, at least 10 steps apart",
        accepts_auto=True,
    )
    eval_batches: Int = param(20, "batches per evaluation", title="Eval batches", ge=1, le=10_000)
    # a new best is an evaluation that beats the best so far by more than min_delta: best/ holds it,
    # and a run that ends past it (stopped early or not) has it as its model (trainer.run.loop)
    early_stopping_patience: Int | None = param(
        None,
        "stop after this many evaluations without a new best validation loss; the model is then the "
        "best checkpoint (0 = off)",
        title="Early stopping patience",
        ge=0,
        le=10_000,
        null_means="auto: 4 when the run passes over its training tokens more than once, else off",
        accepts_auto=True,
    )
    early_stopping_min_delta: float = param(
        0.0,
        "a new best must beat the best validation loss by more than this",
        title="Early stopping min delta",
        ge=0,
        le=1e6,
    )


class CheckpointFields(StrictConfig):
    """What the run writes: checkpoints and the exports of its final model."""

    checkpoint_every: Int = param(
        500,
        "write a checkpoint every N steps (0 = only the final one)",
        title="Checkpoint every",
        ge=0,
        le=MAX_STEPS,
        advanced=False,
    )
    keep_checkpoints: Int = param(
        3,
        "keep the newest K step checkpoints (best/ and final/ are kept too)",
        title="Checkpoints kept",
        ge=1,
        le=1000,
    )
    # exports of the final checkpoint (fromscratch train: OUT/exports/; a job: stored with its model)
    export_formats: Annotated[list[ExportFormat], Distinct] = param(
        list(FINAL_DEFAULT),
        "formats exported from the final model as training ends, the others on first download "
        "(command line: comma-separated, none for no exports)",
        title="Exports at the end",
    )


class RuntimeFields(StrictConfig):
    """Where and how the run computes: devices, precision, compile, memory, limits, logging."""

    device: Literal["auto", "cpu", "cuda"] = param("auto", "auto = cuda when available", title="Device")
    devices: Int = param(
        1,
        "data-parallel processes, one per device (NCCL on CUDA, gloo on CPU); batch_size stays per "
        "process: the global batch is batch_size x grad_accum x devices",
        title="Devices",
        ge=1,
        le=64,
    )
    sharding: Literal["ddp", "fsdp"] = param(
        "ddp",
        "with devices > 1: ddp (every process holds the whole model) or fsdp (FSDP2: parameters, "
        "gradients and optimizer state sharded across the processes)",
        title="Sharding",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = param(
        "auto",
        "auto = bfloat16 on CUDA when supported and on CPUs with native bfloat16 that a probe finds "
        "faster, else float32; bfloat16 autocasts on CPU too",
        title="Dtype",
    )
    compile: bool | None = param(
        None,
        "torch.compile the model",
        title="torch.compile",
        null_means="auto: after timing the first steps, the transformer blocks when that pays back",
    )
    activation_checkpointing: bool = param(
        False,
        "recompute activations in the backward pass (less memory, ~30% slower)",
        title="Activation checkpointing",
    )
    cuda_graphs: bool = param(
        False,
        "replay each transformer block's forward and backward as a CUDA graph (one launch each, not "
        "dozens: for eager steps that wait on the host's launches); with CUDA, one process, dropout "
        "0, grad_accum 1, no activation checkpointing and torch.compile off",
        title="CUDA graphs",
    )
    time_limit: float | None = param(
        None,
        "stop (with a checkpoint) after this many seconds of training",
        title="Time limit (s)",
        gt=0,
        le=1e8,
        null_means="none",
    )
    log_every: Int = param(
        1,
        "steps between loss reports (each costs a device sync)",
        title="Log every (steps)",
        ge=1,
        le=1_000_000,
    )
