"""What every export format shares: its error, the checked state dict it writes from, and the
atomic write (a temporary name beside the destination, renamed into place)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from trainer.config import ModelConfig


class ExportError(ValueError):
    """The export cannot be made as asked; the message says what to change."""


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a `Llama` state dict (output.weight included even when tied)."""
    d, kv, h = cfg.n_embd, cfg.kv_heads * cfg.head_dim, cfg.hidden_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (cfg.vocab_size, d)}
    for i in range(cfg.n_layer):
        p = f"layers.{i}."
        shapes |= {
            p + "attention_norm.weight": (d,),
            p + "attention.wq.weight": (cfg.n_head * cfg.head_dim, d),
            p + "attention.wk.weight": (kv, d),
            p + "attention.wv.weight": (kv, d),
            p + "attention.wo.weight": (d, cfg.n_head * cfg.head_dim),
            p + "ffn_norm.weight": (d,),
            p + "feed_forward.w1.weight": (h, d),
            p + "feed_forward.w2.weight": (d, h),
            p + "feed_forward.w3.weight": (h, d),
        }
    shapes["norm.weight"] = (d,)
    shapes["output.weight"] = (cfg.vocab_size, d)
    return shapes


def checked_state(cfg: ModelConfig, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fp32 CPU copies of the weights, checked against the config; a tied model gets output.weight
    set to the embedding (checkpoints store tied weights once)."""
    state = dict(state_dict)
    if cfg.tie_embeddings:
        state["output.weight"] = state.get("tok_embeddings.weight")  # type: ignore[assignment]
    problems = []
    shapes = expected_shapes(cfg)
    for key, shape in shapes.items():
        t = state.get(key)
        if t is None:
            problems.append(f"{key} is missing")
        elif tuple(t.shape) != shape:
            problems.append(f"{key} has shape {tuple(t.shape)}, the config needs {shape}")
    problems += [f"unexpected tensor {key}" for key in state if key not in shapes]
    if problems:
        raise ExportError("the weights do not match the model config: " + "; ".join(problems))
    return {k: state[k].detach().to("cpu", torch.float32).contiguous() for k in shapes}


def write_atomically(out: Path, write: Callable[[Path], None], *, folder: bool = False) -> Path:
    """Run `write(tmp)` on a temporary sibling of `out`, then move it into place.

    A folder export replaces an existing folder only when that holds nothing but export files
    (never wipe a directory the user pointed at by mistake)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.stem}.tmp-{os.getpid()}{out.suffix}"  # suffix kept: some writers look at it
    _remove(tmp)
    try:
        if folder:
            tmp.mkdir()
        write(tmp)
        if folder and out.exists():
            if not out.is_dir():
                raise ExportError(f"{out} exists and is not a folder; choose another --out")
            known = {p.name for p in tmp.iterdir()}
            stray = sorted(p.name for p in out.iterdir() if p.name not in known)
            if stray:
                raise ExportError(
                    f"{out} already exists and holds other files ({', '.join(stray[:5])}); "
                    "choose an empty or new folder for --out"
                )
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            _remove(old)
            os.replace(out, old)
            os.replace(tmp, out)
            _remove(old)
        else:
            if out.is_dir():
                raise ExportError(f"{out} is a folder; this format writes a single file, give a file path")
            os.replace(tmp, out)
    except BaseException:
        _remove(tmp)
        raise
    return out


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
