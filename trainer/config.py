"""The one schema of hyperparameters: architecture (ModelConfig), training (TrainConfig), presets.

Every field is declared once, here, with its type, default, bounds, help text and form hints
(`param(...)`). Everything else is derived from these declarations at run time by trainer.schema:
the options of `fromscratch train` and `fromscratch jobs create`, the API's validation of a job's
`hyperparameters`, the JSON Schema served at GET /v1/fine_tuning/hyperparameters and the
dashboard's new-job form. Adding a hyperparameter is adding a field below (and using it).

Import-light on purpose (pydantic, no torch): the API and the HTTP client import it. Types are
strict (JSON `"5"` is not an integer, `true` is not a number) except that an integral float is an
integer. Invalid values raise ConfigError listing *every* problem, each naming its field, so a user
fixes a bad config in one round trip.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from trainer.config_errors import ConfigError, problems_from_validation

INT64_MAX = 2**63 - 1


def _integral(value: Any) -> Any:
    """JSON has one number type: accept 5.0 where an integer is expected (never True/False)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= INT64_MAX:
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]


def _distinct(values: list[Any]) -> list[Any]:
    """A list field of choices is a set: each choice at most once (kept in the order given)."""
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
        raise ValueError(f"names {twice[0]!r} twice")
    return values


# A list field's items are a Literal's choices, each at most once (trainer.schema: kind "list").
Distinct = AfterValidator(_distinct)
ExportFormat = Literal["gguf", "hf", "onnx"]


def param(
    default: Any,
    help: str,
    *,
    title: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    null_means: str | None = None,
    advanced: bool = True,
    accepts_auto: bool = False,
    in_job: bool = True,
    in_cli: bool = True,
) -> Any:
    """A config field: its default, one-line help, short form label (title), bounds and hints.

    null_means: what leaving it unset means (fields whose default is None).
    advanced: shown under "Advanced" in the dashboard's form.
    accepts_auto: the API also accepts OpenAI's "auto" (= the default).
    in_job / in_cli: False for a field that is not a job hyperparameter / not a `fromscratch train` option.
    """
    extra: dict[str, Any] = {"x-advanced": advanced}
    if null_means is not None:
        extra["x-null-means"] = null_means
    if accepts_auto:
        extra["x-accepts-auto"] = True
    if not in_job:
        extra["x-in-job"] = False
    if not in_cli:
        extra["x-in-cli"] = False
    return Field(default, title=title, description=help, ge=ge, gt=gt, le=le, lt=lt, json_schema_extra=extra)


class _Config(BaseModel):
    """Strict validation, unknown fields refused, every problem reported as one ConfigError."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, validate_default=False)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ConfigError(problems_from_validation(err, type(self).__name__)) from None
        problems = self._cross_field_problems()
        if problems:
            raise ConfigError(problems)

    def _cross_field_problems(self) -> list[tuple[str, str]]:
        return []

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


class ModelConfig(_Config):
    """LLaMA architecture. `vocab_size` is set from the tokenizer before the model is built."""

    n_layer: Int = param(2, "transformer blocks", title="Layers", ge=1, le=256, advanced=False)
    n_head: Int = param(4, "attention heads", title="Attention heads", ge=1, le=256, advanced=False)
    n_kv_head: Int | None = param(
        None,
        "key/value heads (grouped-query attention; must divide n_head)",
        title="KV heads (GQA)",
        ge=1,
        le=256,
        null_means="= n_head",
        advanced=False,
    )
    n_embd: Int = param(128, "embedding width", title="Embedding size", ge=1, le=16384, advanced=False)
    ctx: Int = param(128, "context length in tokens", title="Context length", ge=1, le=131072, advanced=False)
    vocab_size: Int = param(
        258,
        "vocabulary size (set from the tokenizer)",
        title="Vocabulary",
        ge=1,
        le=1 << 20,
        in_job=False,
        in_cli=False,
    )
    rope_dims: Int | None = param(
        None,
        "rotated dims per head (llama.cpp --rotmax); default the whole head",
        title="RoPE dims",
        ge=2,
        le=16384,
        null_means="= head dim",
    )
    rope_theta: float = param(10000.0, "RoPE base frequency", title="RoPE θ", gt=0, le=1e9)
    ffn_dim: Int | None = param(
        None,
        "SwiGLU hidden width; default llama's rule 2/3*4*n_embd rounded up to multiple_of",
        title="FFN size",
        ge=1,
        le=131072,
        null_means="llama rule (8/3 · n_embd)",
    )
    multiple_of: Int = param(
        32, "round the default FFN width up to a multiple of this", title="FFN multiple of", ge=1, le=4096
    )
    norm_eps: float = param(1e-5, "RMSNorm epsilon", title="RMSNorm ε", gt=0, le=1)
    tie_embeddings: bool = param(
        False, "share the token embedding with the output projection", title="Tie embeddings"
    )

    def model_post_init(self, context: Any) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head

    def _cross_field_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        n_kv_head = self.n_kv_head or self.n_head
        if self.n_embd % self.n_head:
            problems.append(("n_embd", f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"))
        if self.n_head % n_kv_head:
            problems.append(
                ("n_kv_head", f"n_head ({self.n_head}) must be divisible by n_kv_head ({n_kv_head})")
            )
        head_dim = self.n_embd // self.n_head
        if self.rope_dims is not None:
            if self.rope_dims % 2:
                problems.append(("rope_dims", f"must be a positive even number, got {self.rope_dims}"))
            elif self.n_embd % self.n_head == 0 and self.rope_dims > head_dim:
                problems.append(
                    ("rope_dims", f"must be <= head dim n_embd/n_head = {head_dim}, got {self.rope_dims}")
                )
        elif self.n_embd % self.n_head == 0 and head_dim % 2:
            problems.append(("n_embd", f"head dim n_embd/n_head = {head_dim} must be even for RoPE"))
        return problems

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def n_rot(self) -> int:
        return self.rope_dims if self.rope_dims is not None else self.head_dim

    @property
    def hidden_dim(self) -> int:
        if self.ffn_dim is not None:
            return self.ffn_dim
        hidden = int(2 * 4 * self.n_embd / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(**d)

    def num_params(self, non_embedding: bool = False) -> int:
        d, h, kv = self.n_embd, self.hidden_dim, self.kv_heads * self.head_dim
        per_layer = d * d * 2 + d * kv * 2 + 3 * d * h + 2 * d
        emb = self.vocab_size * d
        out = 0 if self.tie_embeddings else self.vocab_size * d
        total = self.n_layer * per_layer + d + emb + out
        return total - (emb if non_embedding else 0)


# Named presets. llama-260k..110m are the llama2.c TinyStories sizes; vocab comes from the tokenizer.
PRESETS: dict[str, dict[str, Any]] = {
    "llama-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ctx=128),
    "llama-260k": dict(n_layer=5, n_head=8, n_kv_head=4, n_embd=64, ctx=512),
    "llama-15m": dict(n_layer=6, n_head=6, n_embd=288, ctx=256),
    "llama-42m": dict(n_layer=8, n_head=8, n_embd=512, ctx=1024),
    "llama-110m": dict(n_layer=12, n_head=12, n_embd=768, ctx=1024),
}
DEFAULT_PRESET = "llama-tiny"


def model_config_from_preset(preset: str = DEFAULT_PRESET, **overrides: Any) -> ModelConfig:
    """A preset with any field overridden (None values are ignored)."""
    if preset not in PRESETS:
        raise ConfigError([("preset", f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")])
    values = dict(PRESETS[preset])
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "n_head" in overrides and "n_kv_head" not in overrides and values.get("n_kv_head") is not None:
        # Overriding n_head alone keeps the preset's GQA ratio only when it still divides.
        n_head, n_kv_head = values["n_head"], values["n_kv_head"]
        if isinstance(n_head, int) and isinstance(n_kv_head, int) and n_kv_head and n_head % n_kv_head:
            values["n_kv_head"] = None
    return ModelConfig(**values)


MAX_STEPS = 10_000_000


class TrainConfig(_Config):
    """Everything about a run that is not architecture. Field `x_y` is CLI option `--x-y`
    and API hyperparameter `x_y`, with the same default."""

    # tokenizer
    tokenizer: Literal["byte", "bpe"] = param(
        "byte",
        "byte: 256 bytes + BOS/EOS, lossless; bpe: byte-level BPE trained on the data",
        title="Tokenizer",
        advanced=False,
    )
    vocab_size: Int | None = param(
        None,
        "BPE vocabulary size (bpe only)",
        title="Vocab size (bpe)",
        ge=1,
        le=65536,
        null_means="258 (byte) / 4096 (bpe)",
        advanced=False,
    )
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
    # optimiser
    optimizer: Literal["adamw", "lbfgs"] = param("adamw", "adamw or lbfgs", title="Optimizer")
    learning_rate: float = param(
        1e-3, "peak learning rate", title="Learning rate", gt=0, le=1e6, advanced=False
    )
    min_lr: float | None = param(
        None,
        "floor of the cosine schedule",
        title="Min learning rate",
        ge=0,
        le=1e6,
        null_means="learning rate / 10",
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
    init_std: float | None = param(
        None,
        "standard deviation of the initial weights (residual projections: divided by sqrt(2 n_layer))",
        title="Init std",
        gt=0,
        le=1,
        null_means="0.02 x sqrt(768 / n_embd): GPT-2's 0.02 at its width, scaled as 1/sqrt(width)",
    )
    weight_decay: float = param(
        0.1, "AdamW weight decay (2-D weights only)", title="Weight decay", ge=0, le=10
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
    grad_clip: float = param(
        1.0, "clip the gradient norm to this (0 disables)", title="Gradient clip (0 = off)", ge=0, le=1e6
    )
    activation_checkpointing: bool = param(
        False,
        "recompute activations in the backward pass (less memory, ~30% slower)",
        title="Activation checkpointing",
    )
    # evaluation
    eval_every: Int = param(
        100,
        "evaluate the validation loss every N steps (0 disables)",
        title="Eval every",
        ge=0,
        le=MAX_STEPS,
        advanced=False,
    )
    eval_batches: Int = param(20, "batches per evaluation", title="Eval batches", ge=1, le=10_000)
    val_fraction: float = param(
        0.1,
        "fraction of the tokens (the last ones) held out for validation",
        title="Validation fraction",
        ge=0,
        lt=1,
    )
    # checkpoints
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
        ["gguf", "hf"],
        "formats exported from the final model as training ends, the others on first download "
        "(command line: comma-separated, none for no exports)",
        title="Exports at the end",
    )
    # what the loss covers
    train_on_inputs: bool = param(
        False,
        "train on every token of prompt/completion and chat data, prompts and other roles' messages "
        "too (default: completions and assistant messages only; plain text always trains on all)",
        title="Train on inputs",
    )
    # data sampling
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
    # hardware
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
        if self.min_lr is not None and self.min_lr > self.learning_rate:
            problems.append(("min_lr", f"must be <= learning_rate ({self.learning_rate}), got {self.min_lr}"))
        return problems

    # Resolved values (the "None = ..." rules above live here only).
    @property
    def resolved_vocab_size(self) -> int:
        return 258 if self.tokenizer == "byte" else (self.vocab_size or 4096)

    @property
    def resolved_min_lr(self) -> float:
        return self.learning_rate / 10 if self.min_lr is None else self.min_lr

    def resolved_warmup(self, total_steps: int) -> int:
        return min(100, total_steps // 10) if self.warmup_steps is None else self.warmup_steps

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        # configs stored before the reserved, never-used `extra` field was dropped still load
        return cls(**{k: v for k, v in d.items() if k != "extra"})
