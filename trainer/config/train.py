"""Training: TrainConfig, everything about a run that is not architecture."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from trainer.config.export_formats import FINAL_DEFAULT, ExportFormat
from trainer.config.fields import INT64_MAX, Distinct, Int, StrictConfig, param

MAX_STEPS = 10_000_000


# TrainConfig is built from one class per concern; `TRAIN_GROUPS` names them in the order the CLI's
# --help, the JSON Schema (x-group) and docs list them. The config itself stays flat: field `x_y` is
# CLI option `--x-y`, API hyperparameter `x_y` and key `x_y` of a checkpoint's train config.


class InitFields(StrictConfig):
    """How the model's weights start and how training regularizes it; the architecture itself, and so
    the exports, is ModelConfig."""

    init_std: float | None = param(
        None,
        "standard deviation of the initial weights (residual projections: divided by sqrt(2 n_layer))",
        title="Init std",
        gt=0,
        le=1,
        null_means="0.02 x sqrt(768 / n_embd): GPT-2's 0.02 at its width, scaled as 1/sqrt(width)",
    )
    # in training only: evaluation, sampling and exports never drop (trainer.model.llama.drop)
    dropout: float = param(
        0.0,
        "probability of zeroing an element of the embedding output, the attention probabilities and "
        "both residual branches of every block while training (0 = off)",
        title="Dropout",
        ge=0,
        le=0.9,
    )


class DataFields(StrictConfig):
    """What the model reads: tokenizer, batches and what the loss covers."""

    tokenizer: Literal["byte", "bpe"] = param(
        "byte",
        "byte: 256 bytes + BOS/EOS, lossless; bpe: byte-level BPE trained on the data",
        title="Tokenizer",
        advanced=False,
    )
    # the vocabulary asked of the tokenizer; the model's (ModelConfig.vocab_size) follows the tokenizer built
    vocab_size: Int | None = param(
        None,
        "BPE vocabulary size (bpe only)",
        title="Vocab size (bpe)",
        ge=1,
        le=65536,
        null_means="258 (byte) / 4096 (bpe)",
        advanced=False,
    )
    # batch = batch_size (micro-batch) * grad_accum sequences of ctx tokens
    batch_size: Int = param(
        16, "sequences per micro-batch", title="Batch size", ge=1, le=4096, accepts_auto=True, advanced=False
    )
    grad_accum: Int = param(
        1,
        "micro-batches accumulated per optimizer step (batch = batch_size x grad_accum)",
        title="Gradient accumulation",
        ge=1,
        le=1024,
    )
    train_on_inputs: bool = param(
        False,
        "train on every token of prompt/completion and chat data, prompts and other roles' messages "
        "too (default: completions and assistant messages only; plain text always trains on all)",
        title="Train on inputs",
    )
    samples_after_nl: bool = param(
        False,
        "start training windows only after a newline (llama.cpp --samples-after-nl)",
        title="Start samples after a newline",
    )
    seed: Int = param(
        1337,
        "random seed (weights init and data order)",
        title="Seed",
        ge=0,
        le=INT64_MAX,
        in_job=False,  # a job's seed is the request's top-level `seed`
    )

    @property
    def resolved_vocab_size(self) -> int:
        """The tokenizer's vocabulary (the "None = ..." rule of vocab_size lives here only)."""
        return 258 if self.tokenizer == "byte" else (self.vocab_size or 4096)


class OptimizerFields(StrictConfig):
    """The optimizer and its settings."""

    optimizer: Literal["adamw", "lbfgs", "muon"] = param(
        "adamw", "adamw, lbfgs or muon (Muon for the blocks' matrices, AdamW for the rest)", title="Optimizer"
    )
    learning_rate: float = param(
        1e-3, "peak learning rate", title="Learning rate", gt=0, le=1e6, advanced=False
    )
    weight_decay: float = param(
        0.1,
        "decoupled weight decay of the 2-D weights: each step shrinks them by the schedule's rate x "
        "this (muon: its matrices by the same factor, whatever muon_learning_rate)",
        title="Weight decay",
        ge=0,
        le=10,
    )
    # 0.8, not the usual 0.9: at the small batches this trains with, less momentum reaches a given
    # loss in fewer steps (bench/README.md, "time to quality")
    beta1: float = param(0.8, "AdamW beta1", title="Adam β1", ge=0, lt=1)
    beta2: float = param(0.95, "AdamW beta2", title="Adam β2", ge=0, lt=1)
    eps: float = param(1e-8, "AdamW epsilon", title="Adam ε", ge=0, le=1)
    embedding_lr_scale: float = param(
        10.0,
        "AdamW: the token embedding's learning rate as a multiple of the schedule's, without weight "
        "decay (untied embeddings only; 1 = like the other weights)",
        title="Embedding LR scale",
        gt=0,
        le=1000,
    )
    # another scale than AdamW's: Muon's step is an orthogonalized matrix, entries of RMS ~1/sqrt(n_embd);
    # 0.02 is the hidden weights' rate Muon's author recommends (github.com/KellerJordan/Muon)
    muon_learning_rate: float = param(
        0.02,
        "muon: peak learning rate of the attention and feed-forward matrices (the schedule scales "
        "it as it scales learning_rate, which the other weights keep)",
        title="Muon learning rate",
        gt=0,
        le=1e6,
    )
    muon_momentum: float = param(
        0.95, "muon: Nesterov momentum of the matrices' updates", title="Muon momentum", ge=0, lt=1
    )
    grad_clip: float = param(
        1.0, "clip the gradient norm to this (0 disables)", title="Gradient clip (0 = off)", ge=0, le=1e6
    )


class ScheduleFields(StrictConfig):
    """How long the run is and the learning rate over it."""

    # length of training: max_steps wins; n_epochs visits windows without replacement
    max_steps: Int | None = param(
        None,
        "optimizer steps",
        title="Max steps",
        ge=1,
        le=MAX_STEPS,
        null_means="1000 unless n_epochs is set",
        advanced=False,
    )
    n_epochs: Int | None = param(
        None,
        "train for this many passes over the data instead of max_steps",
        title="Epochs",
        ge=1,
        le=10_000,
        null_means="off (max steps decide)",
        accepts_auto=True,
    )
    warmup_steps: Int | None = param(
        None,
        "linear warmup steps",
        title="Warmup steps",
        ge=0,
        le=MAX_STEPS,
        null_means="min(100, steps / 10)",
        advanced=False,
    )
    schedule: Literal["cosine", "cosine-restarts", "constant"] = param(
        "cosine", "learning-rate schedule after warmup", title="LR schedule", advanced=False
    )
    min_lr: float | None = param(
        None,
        "floor of the cosine schedule",
        title="Min learning rate",
        ge=0,
        le=1e6,
        null_means="learning rate / 10",
    )
    cos_decay_steps: Int | None = param(
        None,
        "cosine-restarts: length of the first cycle",
        title="Cosine cycle (steps)",
        ge=1,
        le=MAX_STEPS,
        null_means="total steps",
    )
    cos_decay_restart: float = param(
        1.1,
        "cosine-restarts: each cycle is this factor longer than the previous",
        title="Cycle growth",
        ge=1,
        le=100,
    )
    cos_decay_alpha: float = param(
        0.0,
        "cosine-restarts: floor as a fraction of the learning rate",
        title="Cosine floor (× LR)",
        ge=0,
        le=1,
    )

    def resolved_warmup(self, total_steps: int) -> int:
        return min(100, total_steps // 10) if self.warmup_steps is None else self.warmup_steps


class EvaluationFields(StrictConfig):
    """The validation data and how often it is measured."""

    val_fraction: float = param(
        0.1,
        "fraction of the tokens (the last ones) held out for validation",
        title="Validation fraction",
        ge=0,
        lt=1,
    )
    eval_every: Int = param(
        100,
        "evaluate the validation loss every N steps (0 disables)",
        title="Eval every",
        ge=0,
        le=MAX_STEPS,
        advanced=False,
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
        null_means="off for now: a data-aware rule is to come",
        accepts_auto=True,
    )
    early_stopping_min_delta: float = param(
        0.0,
        "a new best must beat the best validation loss by more than this",
        title="Early stopping min delta",
        ge=0,
        le=1e6,
    )

    @property
    def resolved_early_stopping_patience(self) -> int:
        return self.early_stopping_patience or 0  # auto (None): off until measurements pick a rule


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
        null_means="auto: when the run is estimated long enough to pay back compiling",
    )
    activation_checkpointing: bool = param(
        False,
        "recompute activations in the backward pass (less memory, ~30% slower)",
        title="Activation checkpointing",
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


TRAIN_GROUPS: dict[str, type[StrictConfig]] = {
    "model": InitFields,
    "data": DataFields,
    "optimizer": OptimizerFields,
    "schedule": ScheduleFields,
    "evaluation": EvaluationFields,
    "checkpointing": CheckpointFields,
    "runtime": RuntimeFields,
}


class TrainConfig(
    RuntimeFields, CheckpointFields, EvaluationFields, ScheduleFields, OptimizerFields, DataFields, InitFields
):
    """Everything about a run that is not architecture: the fields of every group in TRAIN_GROUPS,
    flat, with the rules that span groups."""

    def _cross_field_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if self.tokenizer == "bpe" and self.vocab_size is not None and not 260 <= self.vocab_size <= 65536:
            problems.append(("vocab_size", f"bpe vocab_size must be in [260, 65536], got {self.vocab_size}"))
        if self.tokenizer == "byte" and self.vocab_size not in (None, 258):
            problems.append(
                ("vocab_size", "the byte tokenizer has a fixed vocabulary of 258; use --tokenizer bpe")
            )
        if self.sharding == "fsdp" and self.dtype == "float16":
            problems.append(
                ("dtype", "float16 needs a gradient scaler, which sharding fsdp does not use; use bfloat16")
            )
        if self.devices > 1 and self.optimizer == "lbfgs":
            problems.append(("devices", "L-BFGS trains in one process; use devices 1 or optimizer adamw"))
        if self.devices > 1 and self.sharding == "fsdp" and self.optimizer == "muon":
            problems.append(("sharding", "optimizer muon needs whole matrices, which fsdp shards; use ddp"))
        if self.min_lr is not None and self.min_lr > self.learning_rate:
            problems.append(("min_lr", f"must be <= learning_rate ({self.learning_rate}), got {self.min_lr}"))
        if self.early_stopping_patience and not self.eval_every:
            problems.append(
                ("early_stopping_patience", "counts evaluations: set eval_every > 0, or use 0 (off)")
            )
        return problems

    @property
    def resolved_min_lr(self) -> float:
        return self.learning_rate / 10 if self.min_lr is None else self.min_lr

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        # configs stored before the reserved, never-used `extra` field was dropped still load
        return cls(**{k: v for k, v in d.items() if k != "extra"})


def group_of(field: str) -> str:
    """The TRAIN_GROUPS key of a TrainConfig field."""
    return next(name for name, group in TRAIN_GROUPS.items() if field in group.model_fields)
