"""Configuration for the llama trainer: architecture (ModelConfig), training (TrainConfig), presets.

This module is import-light on purpose (no torch): the API validates hyperparameters with it.
Both dataclasses validate in `__post_init__` and report *every* problem at once, each naming its
field, so a user fixes a bad config in one round trip (as litgpt does).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal


class ConfigError(ValueError):
    """One or more invalid fields. `problems` is a list of (field_name, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{name}: {msg}" for name, msg in problems))

    @property
    def param(self) -> str:
        """The first offending field (what the API reports as `error.param`)."""
        return self.problems[0][0]


def _positive(problems: list[tuple[str, str]], obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value <= 0:
            problems.append((name, f"must be positive, got {value}"))


@dataclass
class ModelConfig:
    """LLaMA architecture. `vocab_size` is set from the tokenizer before the model is built."""

    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int | None = None  # None = n_head (plain multi-head attention); fewer = GQA
    n_embd: int = 128
    ctx: int = 128  # context length (block size)
    vocab_size: int = 258
    rope_dims: int | None = None  # rotated dims per head (llama.cpp --rotmax); None = head_dim
    rope_theta: float = 10000.0
    ffn_dim: int | None = None  # None = llama's rule: 2/3 * 4 * n_embd rounded up to multiple_of
    multiple_of: int = 32
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        problems: list[tuple[str, str]] = []
        _positive(
            problems,
            self,
            "n_layer",
            "n_head",
            "n_kv_head",
            "n_embd",
            "ctx",
            "vocab_size",
            "multiple_of",
            "ffn_dim",
            "rope_theta",
            "norm_eps",
        )
        if not problems:
            if self.n_embd % self.n_head:
                problems.append(
                    ("n_embd", f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
                )
            if self.n_head % self.n_kv_head:
                problems.append(
                    ("n_kv_head", f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head})")
                )
            head_dim = self.n_embd // self.n_head
            if self.rope_dims is not None:
                if self.rope_dims <= 0 or self.rope_dims % 2:
                    problems.append(("rope_dims", f"must be a positive even number, got {self.rope_dims}"))
                elif self.n_embd % self.n_head == 0 and self.rope_dims > head_dim:
                    problems.append(
                        ("rope_dims", f"must be <= head dim n_embd/n_head = {head_dim}, got {self.rope_dims}")
                    )
            elif self.n_embd % self.n_head == 0 and head_dim % 2:
                problems.append(("n_embd", f"head dim n_embd/n_head = {head_dim} must be even for RoPE"))
        if problems:
            raise ConfigError(problems)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_rot(self) -> int:
        return self.rope_dims if self.rope_dims is not None else self.head_dim

    @property
    def hidden_dim(self) -> int:
        if self.ffn_dim is not None:
            return self.ffn_dim
        hidden = int(2 * 4 * self.n_embd / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(**_known(cls, d, "model"))

    def num_params(self, non_embedding: bool = False) -> int:
        d, h, kv = self.n_embd, self.hidden_dim, self.n_kv_head * self.head_dim
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
MODEL_FIELDS = (
    "n_layer",
    "n_head",
    "n_kv_head",
    "n_embd",
    "ctx",
    "rope_dims",
    "rope_theta",
    "ffn_dim",
    "multiple_of",
    "norm_eps",
    "tie_embeddings",
)


def model_config_from_preset(preset: str = DEFAULT_PRESET, **overrides: Any) -> ModelConfig:
    """A preset with any field overridden (None values are ignored)."""
    if preset not in PRESETS:
        raise ConfigError([("preset", f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")])
    unknown = [k for k in overrides if k not in MODEL_FIELDS and k != "vocab_size"]
    if unknown:
        raise ConfigError([(k, "unknown model field") for k in unknown])
    values = dict(PRESETS[preset])
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "n_head" in overrides and "n_kv_head" not in overrides and values.get("n_kv_head") is not None:
        # Overriding n_head alone keeps the preset's GQA ratio only when it still divides.
        if values["n_head"] % values["n_kv_head"]:
            values["n_kv_head"] = None
    return ModelConfig(**values)


@dataclass
class TrainConfig:
    """Everything about a run that is not architecture. Field `x_y` is CLI option `--x-y`
    and API hyperparameter `x_y`, with the same default."""

    # tokenizer
    tokenizer: Literal["byte", "bpe"] = "byte"
    vocab_size: int | None = None  # bpe only; default 4096
    # length of training: max_steps wins; n_epochs visits windows without replacement
    max_steps: int | None = None  # None with n_epochs None = 1000 steps
    n_epochs: int | None = None
    # batch = batch_size (micro-batch) * grad_accum sequences of ctx tokens
    batch_size: int = 16
    grad_accum: int = 1
    # optimiser
    optimizer: Literal["adamw", "lbfgs"] = "adamw"
    learning_rate: float = 1e-3
    min_lr: float | None = None  # None = learning_rate / 10
    warmup_steps: int | None = None  # None = min(100, total_steps // 10)
    schedule: Literal["cosine", "cosine-restarts", "constant"] = "cosine"
    cos_decay_steps: int | None = None  # cosine-restarts: first cycle length (None = total_steps)
    cos_decay_restart: float = 1.1  # cosine-restarts: each cycle is this factor longer
    cos_decay_alpha: float = 0.0  # cosine-restarts: floor as a fraction of learning_rate
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables
    activation_checkpointing: bool = False
    # evaluation
    eval_every: int = 100  # 0 disables
    eval_batches: int = 20
    val_fraction: float = 0.1
    # checkpoints
    checkpoint_every: int = 500  # 0 = only the final checkpoint
    keep_checkpoints: int = 3
    # data sampling
    samples_after_nl: bool = False
    seed: int = 1337
    # hardware
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: bool = False
    time_limit: float | None = None  # seconds of training; stop (with a checkpoint) after it
    log_every: int = 1  # steps between loss reports (each costs a device sync)
    extra: dict[str, Any] = field(default_factory=dict)  # reserved; not validated

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        _positive(
            problems,
            self,
            "vocab_size",
            "max_steps",
            "n_epochs",
            "batch_size",
            "grad_accum",
            "eval_batches",
            "keep_checkpoints",
            "log_every",
            "cos_decay_steps",
            "time_limit",
        )
        for name in ("learning_rate",):
            if getattr(self, name) <= 0:
                problems.append((name, f"must be positive, got {getattr(self, name)}"))
        for name in (
            "min_lr",
            "warmup_steps",
            "weight_decay",
            "grad_clip",
            "eval_every",
            "checkpoint_every",
            "cos_decay_alpha",
            "eps",
        ):
            value = getattr(self, name)
            if value is not None and value < 0:
                problems.append((name, f"must be >= 0, got {value}"))
        choices = {
            "tokenizer": ("byte", "bpe"),
            "optimizer": ("adamw", "lbfgs"),
            "schedule": ("cosine", "cosine-restarts", "constant"),
            "device": ("auto", "cpu", "cuda"),
            "dtype": ("auto", "float32", "bfloat16", "float16"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                problems.append((name, f"must be one of {', '.join(allowed)}; got {getattr(self, name)!r}"))
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                problems.append((name, f"must be in [0, 1), got {getattr(self, name)}"))
        if not 0 <= self.val_fraction < 1:
            problems.append(("val_fraction", f"must be in [0, 1), got {self.val_fraction}"))
        if self.cos_decay_restart < 1:
            problems.append(("cos_decay_restart", f"must be >= 1, got {self.cos_decay_restart}"))
        if self.tokenizer == "bpe" and self.vocab_size is not None and not 260 <= self.vocab_size <= 65536:
            problems.append(("vocab_size", f"bpe vocab_size must be in [260, 65536], got {self.vocab_size}"))
        if self.tokenizer == "byte" and self.vocab_size not in (None, 258):
            problems.append(
                ("vocab_size", "the byte tokenizer has a fixed vocabulary of 258; use --tokenizer bpe")
            )
        if self.min_lr is not None and self.min_lr > self.learning_rate:
            problems.append(("min_lr", f"must be <= learning_rate ({self.learning_rate}), got {self.min_lr}"))
        if problems:
            raise ConfigError(problems)

    # Resolved values (the "None = ..." rules above live here only).
    @property
    def resolved_vocab_size(self) -> int:
        return 258 if self.tokenizer == "byte" else (self.vocab_size or 4096)

    @property
    def resolved_min_lr(self) -> float:
        return self.learning_rate / 10 if self.min_lr is None else self.min_lr

    def resolved_warmup(self, total_steps: int) -> int:
        return min(100, total_steps // 10) if self.warmup_steps is None else self.warmup_steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        return cls(**_known(cls, d, "train"))


TRAIN_FIELDS = tuple(f.name for f in fields(TrainConfig) if f.name != "extra")


# One-line help per config field, shared by `fromscratch train` and `fromscratch jobs create`.
FIELD_HELP: dict[str, str] = {
    "n_layer": "transformer blocks",
    "n_head": "attention heads",
    "n_kv_head": "key/value heads (grouped-query attention; must divide --n-head)",
    "n_embd": "embedding width",
    "ctx": "context length in tokens",
    "rope_dims": "rotated dims per head (llama.cpp --rotmax); default the whole head",
    "rope_theta": "RoPE base frequency",
    "ffn_dim": "SwiGLU hidden width; default llama's rule 2/3*4*n_embd rounded up to --multiple-of",
    "multiple_of": "round the default FFN width up to a multiple of this",
    "norm_eps": "RMSNorm epsilon",
    "tie_embeddings": "share the token embedding with the output projection",
    "tokenizer": "byte: 256 bytes + BOS/EOS, lossless; bpe: byte-level BPE trained on DATA",
    "vocab_size": "BPE vocabulary size (bpe only; unset = 4096)",
    "max_steps": "optimizer steps (unset and no --n-epochs = 1000)",
    "n_epochs": "train for this many passes over the data instead of --max-steps",
    "batch_size": "sequences per micro-batch",
    "grad_accum": "micro-batches accumulated per optimizer step (batch = batch-size x grad-accum)",
    "optimizer": "adamw or lbfgs",
    "learning_rate": "peak learning rate",
    "min_lr": "floor of the cosine schedule (unset = learning-rate / 10)",
    "warmup_steps": "linear warmup steps (unset = min(100, total steps / 10))",
    "schedule": "learning-rate schedule after warmup",
    "cos_decay_steps": "cosine-restarts: length of the first cycle (unset = total steps)",
    "cos_decay_restart": "cosine-restarts: each cycle is this factor longer than the previous",
    "cos_decay_alpha": "cosine-restarts: floor as a fraction of the learning rate",
    "weight_decay": "AdamW weight decay (2-D weights only)",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "eps": "AdamW epsilon",
    "grad_clip": "clip the gradient norm to this (0 disables)",
    "activation_checkpointing": "recompute activations in the backward pass (less memory, ~30%% slower)",
    "eval_every": "evaluate the validation loss every N steps (0 disables)",
    "eval_batches": "batches per evaluation",
    "val_fraction": "fraction of the tokens (the last ones) held out for validation",
    "checkpoint_every": "write a checkpoint every N steps (0 = only the final one)",
    "keep_checkpoints": "keep the newest K step checkpoints (best/ and final/ are kept too)",
    "samples_after_nl": "start training windows only after a newline (llama.cpp --samples-after-nl)",
    "seed": "random seed (weights init and data order)",
    "device": "auto = cuda when available",
    "dtype": "auto = bfloat16 on CUDA when supported, else float32; bfloat16 autocasts on CPU too",
    "compile": "torch.compile the model",
    "time_limit": "stop (with a checkpoint) after this many seconds of training",
    "log_every": "steps between loss reports",
}


def field_type(hint: Any) -> tuple[type, tuple[str, ...] | None]:
    """(python type, choices) of a config field annotation: `int | None` -> (int, None),
    `Literal["a", "b"]` -> (str, ("a", "b")). Used to build CLI options from the dataclasses."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        return str, tuple(typing.get_args(hint))
    return hint, None


def _known(cls: type, d: dict[str, Any], what: str) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ConfigError([(k, f"unknown {what} config field") for k in unknown])
    return dict(d)
