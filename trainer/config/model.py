"""LLaMA architecture: ModelConfig and the named presets."""

from __future__ import annotations

import math
from typing import Any

from trainer.config.errors import ConfigError
from trainer.config.fields import Int, StrictConfig, param


class ModelConfig(StrictConfig):
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
    # The embedding's rows: the tokenizer's real size, never asked for (trainer.run.setup sets it from
    # the tokenizer; api.hyperparams from TrainConfig.resolved_vocab_size). TrainConfig.vocab_size is
    # the size asked of a BPE tokenizer: the API's and CLI's `vocab_size`. Both names stay: they are
    # keys of stored configs (checkpoints, job rows) and of the HF and GGUF exports.
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
    try:
        return ModelConfig(**values)
    except ConfigError as e:
        # the preset's n_embd has a problem only with the n_head given: it is that n_head's
        only_heads = overrides.get("n_embd") is None and overrides.get("n_head") is not None
        raise ConfigError(
            [("n_head" if only_heads and f == "n_embd" else f, m) for f, m in e.problems]
        ) from e
