"""Self-describing checkpoint folders (see docs/INTERFACES.md):

    model.safetensors       model weights, fp32, tied output weight stored once (as tok_embeddings)
    optimizer.safetensors   optimizer tensors, keys "state.<param_name>.<key>" (list items: ".<i>")
    config.json             {"model": ModelConfig.to_dict(), "train": TrainConfig.to_dict()}
    tokenizer.json          Tokenizer.to_json()
    state.json              step, tokens_seen, best_val_loss (best_step, evals_since_best: early
                            stopping's count), RNG states, sampler state,
                            optimizer_meta (the non-tensor optimizer state), total_steps

Tensors go through safetensors and everything else through JSON, so loading never unpickles.
A folder is written as `<name>.tmp-<pid>` and renamed into place, so a crash never leaves a
half-written checkpoint under a real name.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trainer.checkpoint_snapshot import (
    FORMAT_VERSION,
    OPTIMIZER_FILE,
    fsync_tree,
    move_into_place,
    param_names,
    take_snapshot,
    write_snapshot,
)
from trainer.checkpoint_snapshot import (  # re-exported: the checkpoint format's API is here
    get_rng_state as get_rng_state,
)
from trainer.checkpoint_snapshot import (
    optimizer_to_tensors as optimizer_to_tensors,
)
from trainer.config import ModelConfig, TrainConfig

if TYPE_CHECKING:  # both imported lazily below
    from trainer.data.tokenizers import Tokenizer
    from trainer.model.llama import Llama

STEP_DIR_RE = re.compile(r"^step-(\d{8,})$")


class CheckpointError(ValueError):
    """A folder that is not a (complete) checkpoint."""


@dataclass
class Checkpoint:
    model_config: ModelConfig
    train_config: TrainConfig
    tokenizer: Tokenizer
    model_state: dict[str, torch.Tensor]
    state: dict[str, Any]
    path: Path

    @property
    def step(self) -> int:
        return int(self.state["step"])


# ---------------------------------------------------------------- RNG states (JSON-serialisable)


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def set_rng_state(rng: dict[str, Any]) -> None:
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(rng["torch"]))
    if rng.get("cuda") and torch.cuda.is_available():
        states = [_unb64(s) for s in rng["cuda"]][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)


# ---------------------------------------------------------------- optimizer state <-> safetensors


def _decode(desc: dict[str, Any], key: str, tensors: dict[str, torch.Tensor]) -> Any:
    if desc["kind"] == "tensor":
        return tensors[key]
    if desc["kind"] == "list":
        return [_decode(d, f"{key}.{i}", tensors) for i, d in enumerate(desc["items"])]
    return desc["value"]


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, ckpt_path: Path, meta: dict[str, Any]
) -> None:
    """Restore the per-parameter state saved by `optimizer_to_tensors` into a freshly built optimizer
    of the same type (hyperparameters stay those of the fresh optimizer, i.e. the current config)."""
    if meta.get("type") != type(optimizer).__name__:
        raise CheckpointError(
            f"{ckpt_path}: optimizer is {meta.get('type')}, this run uses {type(optimizer).__name__}"
        )
    with _reading(Path(ckpt_path), OPTIMIZER_FILE):
        tensors = load_file(str(Path(ckpt_path) / OPTIMIZER_FILE))
    names = param_names(model)
    sd = optimizer.state_dict()
    index = 0
    state: dict[int, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            if name in meta["state"]:
                state[index] = {
                    k: _decode(d, f"state.{name}.{k}", tensors) for k, d in meta["state"][name].items()
                }
            index += 1
    sd["state"] = state
    optimizer.load_state_dict(sd)


# ---------------------------------------------------------------- folders


def save_checkpoint(
    path: Path,
    *,
    model: torch.nn.Module,
    model_config: ModelConfig,
    train_config: TrainConfig,
    tokenizer: Tokenizer,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    extra_meta: dict[str, Any] | None = None,
) -> Path:
    """Write a complete checkpoint folder at `path` atomically (replacing one already there), now.

    `state` holds step, tokens_seen, best_val_loss, sampler, total_steps; RNG states and the
    optimizer's non-tensor state are added here. `extra_meta` (e.g. the GradScaler state) is
    stored in state.json under optimizer_meta["extra"]. A training run writes its checkpoints in
    the background instead (trainer.checkpoint_snapshot, trainer.run.checkpoint_writer)."""
    snapshot = take_snapshot(
        model=model,
        model_config=model_config,
        train_config=train_config,
        tokenizer=tokenizer,
        state=state,
        optimizer=optimizer,
        extra_meta=extra_meta,
    )
    return write_snapshot(snapshot, path)


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """A copy of the checkpoint folder `src` at `dst`, put in place like save_checkpoint's (atomically,
    replacing one there). Files are hard links where the file system allows: no checkpoint file is
    ever changed in place (a new save replaces the whole folder), so the copies cannot diverge."""
    tmp = dst.parent / f"{dst.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, copy_function=_link_or_copy)
        fsync_tree(tmp)
        move_into_place(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # no hard links here (another device, a file system without them)
        shutil.copy2(src, dst)


def best_of_run(step_checkpoint: Path) -> tuple[int | None, Path | None]:
    """The best evaluation of the run that wrote `step_checkpoint` (a folder of its checkpoints/), as
    that checkpoint's state names it: (its step or None before any, the run's best/ when it holds it)."""
    step = read_state(step_checkpoint).get("best_step")
    return step, checkpoint_of_step(Path(step_checkpoint).parent.parent / "best", step)


def checkpoint_of_step(path: Path, step: int | None) -> Path | None:
    """`path` when it is a complete checkpoint of step `step`, else None (absent, incomplete, or of
    another step: e.g. best/ left by an attempt that got further than the checkpoint resumed)."""
    try:
        return path if step is not None and read_state(path).get("step") == step else None
    except (CheckpointError, ValueError):  # ValueError: a state.json cut short
        return None


def read_state(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not (path / "state.json").is_file():
        raise CheckpointError(f"{path} is not a checkpoint folder (no state.json)")
    with _reading(path, "state.json"):
        state = json.loads((path / "state.json").read_text())
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
        return state


@contextlib.contextmanager
def _reading(path: Path, name: str) -> Iterator[None]:
    """A file of the checkpoint folder `path` that is missing or cannot be read: a CheckpointError
    naming it (an incomplete copy, a truncated download), not the reader's own exception."""
    try:
        yield
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {name} is missing (an incomplete checkpoint folder)") from None
    except (ValueError, KeyError, TypeError, OSError, SafetensorError) as e:
        raise CheckpointError(f"{path}: {name} is unreadable or corrupt ({e})") from None


def model_folder(path: Path) -> Path:
    """The checkpoint folder `path` names: itself, or the model of a run folder (`train --out OUT`:
    OUT/final). CheckpointError otherwise, naming the checkpoints the folder holds, if any."""
    path = Path(path)
    if (path / "state.json").exists():
        return path
    if (path / "final" / "state.json").exists():
        return path / "final"
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such folder")
    held = [path / "best"] if (path / "best" / "state.json").exists() else []
    held += [d for _, d in list_step_checkpoints(path / "checkpoints")]
    if held:
        why = f"no final/ (the run has not ended as a model); its checkpoints: {', '.join(map(str, held))}"
    else:
        why = "no state.json (a checkpoint folder) and no final/ (a run folder's model, OUT/final)"
    raise CheckpointError(f"{path}: {why}")


def checkpoint_configs(path: Path) -> tuple[ModelConfig, TrainConfig]:
    """A checkpoint's architecture and training settings (config.json), without its weights."""
    with _reading(path, "config.json"):
        configs = json.loads((Path(path) / "config.json").read_text())
        return ModelConfig.from_dict(configs["model"]), TrainConfig.from_dict(configs["train"])


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint folder (model weights on CPU, fp32; optimizer tensors are not loaded)."""
    from trainer.data.tokenizers import tokenizer_from_json  # lazy: keeps this module light for the API

    path = Path(path)
    state = read_state(path)
    if state.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {state['format_version']} is newer than this trainer"
        )
    model_config, train_config = checkpoint_configs(path)
    with _reading(path, "tokenizer.json"):
        tokenizer = tokenizer_from_json(json.loads((path / "tokenizer.json").read_text()))
    with _reading(path, "model.safetensors"):
        model_state = load_file(str(path / "model.safetensors"))
    if model_config.tie_embeddings and "output.weight" not in model_state:
        model_state["output.weight"] = model_state["tok_embeddings.weight"]
    return Checkpoint(model_config, train_config, tokenizer, model_state, state, path)


def load_model(path: Path, device: str | torch.device = "cpu") -> tuple[Llama, Tokenizer]:
    """(Llama in eval mode on `device`, Tokenizer) from a checkpoint folder."""
    from trainer.model.llama import Llama

    ckpt = load_checkpoint(path)
    model = Llama(ckpt.model_config)
    model.load_state_dict(ckpt.model_state, strict=True)
    return model.to(device).eval(), ckpt.tokenizer


def list_step_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Complete `step-XXXXXXXX` folders in ckpt_dir, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = []
    for d in ckpt_dir.iterdir():
        m = STEP_DIR_RE.match(d.name)
        if m and (d / "state.json").exists():
            found.append((int(m.group(1)), d))
    return sorted(found)


def rotate_checkpoints(ckpt_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step folders (and leftovers of interrupted writes); the
    kept ones older than the newest drop their optimizer state, which only a resume needs."""
    removed = []
    found = list_step_checkpoints(ckpt_dir)
    for _, d in found[:-keep] if keep > 0 else []:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    for _, d in found[-keep:-1] if keep > 0 else found[:-1]:
        drop_optimizer_state(d)
    if Path(ckpt_dir).is_dir():
        for d in Path(ckpt_dir).iterdir():
            if (".tmp-" in d.name or ".old-" in d.name) and not d.name.endswith(f"-{os.getpid()}"):
                shutil.rmtree(d, ignore_errors=True)
    return removed


def drop_optimizer_state(folder: Path) -> None:
    """Make a checkpoint weights-only by unlinking its optimizer file. Nothing is rewritten in
    place (copies of the folder share its files as hard links, and keep theirs); state.json still
    describes the optimizer, so a resume checks `has_optimizer_state` first."""
    (Path(folder) / OPTIMIZER_FILE).unlink(missing_ok=True)


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The checkpoint with the highest step in out_dir (checkpoints/step-* or final/), if any."""
    out_dir = Path(out_dir)
    candidates = list_step_checkpoints(out_dir / "checkpoints")
    final = out_dir / "final"
    if (final / "state.json").exists():
        candidates.append((int(read_state(final)["step"]), final))
    if not candidates:
        return None
    return max(candidates, key=lambda c: c[0])[1]
