"""Exports of a trained model for outside consumers: GGUF (llama.cpp), a Hugging Face folder
(transformers), ONNX (onnxruntime).

`export(ckpt_dir, fmt, out, dtype)` reads a checkpoint folder; `export_model(...)` does the same
from objects already in memory (the trainer and tests use it). Each format lives in its own module
and is imported only when asked for, so `import trainer.export` pulls in neither gguf, transformers
nor onnx.

Every export is written next to its destination under a temporary name and renamed into place,
so a crash never leaves a half-written file where a consumer would look for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.config import ModelConfig
from trainer.config.export_formats import dtype_problem
from trainer.export.common import ExportError, checked_state

if TYPE_CHECKING:
    from trainer.data.tokenizers import Tokenizer


def export(
    ckpt_dir: Path | str, fmt: str, out: Path | str, dtype: str = "f32", *, name: str | None = None
) -> Path:
    """Export the checkpoint folder `ckpt_dir` to `out`, a file or a folder as the format is
    (trainer.config.export_formats lists them and the dtypes each takes). `name` is the model's name
    in the file's metadata (GGUF's general.name; default: after the folder)."""
    from trainer.checkpoint import load_checkpoint

    _check_choice(fmt, dtype)
    ckpt = load_checkpoint(Path(ckpt_dir))
    name = name or f"fromscratch-{Path(ckpt_dir).resolve().name}"
    return export_model(ckpt.model_config, ckpt.model_state, ckpt.tokenizer, fmt, out, dtype, name=name)


def export_model(
    model_cfg: ModelConfig,
    state_dict: Mapping[str, torch.Tensor],
    tokenizer: Tokenizer,
    fmt: str,
    out: Path | str,
    dtype: str = "f32",
    *,
    name: str | None = None,
) -> Path:
    """Export in-memory weights (a `Llama` state dict, tied output optional) and their tokenizer."""
    _check_choice(fmt, dtype)
    out = Path(out)
    if tokenizer.vocab_size != model_cfg.vocab_size:
        raise ExportError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
            f"{model_cfg.vocab_size}; export the tokenizer the model was trained with"
        )
    state = checked_state(model_cfg, state_dict)
    name = name or out.stem or "fromscratch"
    if fmt == "gguf":
        from trainer.export.gguf import write_gguf

        return write_gguf(model_cfg, state, tokenizer, out, dtype, name)
    if fmt == "hf":
        from trainer.export.hf import write_hf

        return write_hf(model_cfg, state, tokenizer, out, dtype)
    from trainer.export.onnx import write_onnx

    return write_onnx(model_cfg, state, tokenizer, out, dtype)


def _check_choice(fmt: str, dtype: str) -> None:
    problem = dtype_problem(fmt, dtype)
    if problem is not None:
        raise ExportError(problem)
