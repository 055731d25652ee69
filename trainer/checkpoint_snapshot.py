"""A checkpoint in two halves: `take_snapshot` captures everything a checkpoint folder holds at
the current step (tensors copied to host memory, the rest as JSON text), and `write_snapshot`
writes those captured bytes to a folder later. Between the two the model trains on: the training
loop pays for the host copy only, while a background thread (trainer.run.checkpoint_writer) writes.

Host copies go into `HostBuffers`, reused from one checkpoint to the next (pinned memory when the
tensors are on CUDA, so the device-to-host copy runs at full bus speed): at most one snapshot is
being written at a time, so one set of buffers is enough. Without buffers (a synchronous save)
the tensors are CPU views or copies that nobody changes before the write.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from trainer.config import ModelConfig, TrainConfig
    from trainer.data.tokenizers import Tokenizer

OPTIMIZER_FILE = "optimizer.safetensors"


@dataclass
class CheckpointSnapshot:
    model: dict[str, torch.Tensor]  # fp32 host tensors, the tied output weight stored once
    optimizer: dict[str, torch.Tensor] | None  # "state.<param>.<key>" host tensors; None: weights only
    documents: dict[str, str]  # file name -> JSON text; state.json is written last

    @property
    def nbytes(self) -> int:
        tensors = [*self.model.values(), *(self.optimizer or {}).values()]
        return sum(t.numel() * t.element_size() for t in tensors)


class HostBuffers:
    """Host tensors that snapshots copy into, one per tensor name, kept for the next snapshot.
    Only one snapshot may hold them at a time (the writer finishes one before the next is taken)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def copy(self, key: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        buf = self._buffer(key, tensor, dtype)
        buf.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
        return buf

    def _buffer(self, key: str, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != dtype:
            pin = like.is_cuda and torch.cuda.is_available()
            buf = torch.empty(like.shape, dtype=dtype, pin_memory=pin)
            self._buffers[key] = buf
        return buf

    def reserve(self, like: dict[str, tuple[torch.Tensor, torch.dtype]]) -> None:
        """Allocate now the buffers `copy` will want for these keys (tensor it copies, dtype)."""
        for key, (tensor, dtype) in like.items():
            self._buffer(key, tensor, dtype)

    def tensors(self) -> list[torch.Tensor]:
        return list(self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()


# ---------------------------------------------------------------- what a snapshot captures

FORMAT_VERSION = 1


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def get_rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert not isinstance(keys, str)  # legacy=True: the MT19937 key array
    cuda = [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else None
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
        "cuda": cuda,
    }


def param_names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}  # tied weights: first name only


def _encode(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Tensors go to `tensors[key]`; lists recurse; plain numbers stay in the JSON descriptor."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach()  # copied to host memory by the snapshot
        return {"kind": "tensor"}
    if isinstance(value, (list, tuple)):
        return {"kind": "list", "items": [_encode(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float)):
        return {"kind": "value", "value": value}
    raise TypeError(f"cannot store optimizer state {key} of type {type(value).__name__}")


def optimizer_to_tensors(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Flatten optimizer state to ({"state.<param>.<key>": tensor where it lives}, JSON meta)."""
    names = param_names(model)
    tensors: dict[str, torch.Tensor] = {}
    state_meta: dict[str, dict[str, Any]] = {}
    groups = []
    for group in optimizer.param_groups:
        hyper = {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items() if k != "params"}
        groups.append({"hyper": hyper, "params": [names[id(p)] for p in group["params"]]})
        for p in group["params"]:
            if p in optimizer.state and optimizer.state[p]:
                name = names[id(p)]
                state_meta[name] = {
                    k: _encode(v, f"state.{name}.{k}", tensors) for k, v in optimizer.state[p].items()
                }
    meta = {"type": type(optimizer).__name__, "param_groups": groups, "state": state_meta}
    return tensors, meta


def _to_host(
    tensors: dict[str, torch.Tensor], buffers: HostBuffers | None, prefix: str, dtype: torch.dtype | None
) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        want = dtype or t.dtype
        if buffers is not None:
            out[name] = buffers.copy(prefix + name, t, want)
        else:
            out[name] = t.detach().to("cpu", want).contiguous()
    return out


def _unshare(tensors: dict[str, torch.Tensor]) -> None:
    """safetensors refuses tensors sharing memory: copy the (rare) aliases."""
    seen: set[tuple[int, int]] = set()
    for k, t in tensors.items():
        ident = (t.untyped_storage().data_ptr(), int(t.storage_offset()))
        if ident in seen or t.numel() == 0:
            tensors[k] = t.clone()
        seen.add(ident)


def buffer_plan(
    model: torch.nn.Module, model_config: ModelConfig, optimizer: torch.optim.Optimizer | None
) -> dict[str, tuple[torch.Tensor, torch.dtype]]:
    """What `take_snapshot` will copy into buffers, by buffer key: (the tensor, its host dtype)."""
    plan = {f"model.{name}": (t, torch.float32) for name, t in _weights(model, model_config).items()}
    if optimizer is not None:
        tensors, _ = optimizer_to_tensors(optimizer, model)
        plan.update({f"optimizer.{name}": (t, t.dtype) for name, t in tensors.items()})
    return plan


def _weights(model: torch.nn.Module, model_config: ModelConfig) -> dict[str, torch.Tensor]:
    weights = model.state_dict()
    if model_config.tie_embeddings:
        weights.pop("output.weight", None)  # same tensor as tok_embeddings.weight; stored once
    return weights


def take_snapshot(
    *,
    model: torch.nn.Module,
    model_config: ModelConfig,
    train_config: TrainConfig,
    tokenizer: Tokenizer,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    extra_meta: dict[str, Any] | None = None,
    buffers: HostBuffers | None = None,
) -> CheckpointSnapshot:
    """Everything `write_snapshot` needs, captured now (RNG states included). `optimizer` None: a
    weights-only checkpoint (best/, older kept ones), which a run can be evaluated or exported
    from but not resumed with its optimizer's moments."""
    host_model = _to_host(_weights(model, model_config), buffers, "model.", torch.float32)
    host_optimizer = None
    full_state = {"format_version": FORMAT_VERSION, **state, "rng": get_rng_state()}
    full_state["optimizer_meta"] = None
    if optimizer is not None:
        tensors, meta = optimizer_to_tensors(optimizer, model)
        meta["extra"] = extra_meta or {}
        host_optimizer = _to_host(tensors, buffers, "optimizer.", None)
        _unshare(host_optimizer)
        full_state["optimizer_meta"] = meta
    if buffers is not None and torch.cuda.is_available():
        torch.cuda.synchronize()  # the non-blocking copies into pinned memory have landed
    documents = {
        "config.json": _json({"model": model_config.to_dict(), "train": train_config.to_dict()}),
        "tokenizer.json": _json(tokenizer.to_json()),
        "state.json": _json(full_state),
    }
    return CheckpointSnapshot(host_model, host_optimizer, documents)


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=1) + "\n"


def write_snapshot(snapshot: CheckpointSnapshot, path: Path) -> Path:
    """Write the snapshot as a complete checkpoint folder at `path`, atomically: built under
    `<name>.tmp-<pid>`, fsynced, then renamed over whatever was there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write_safetensors(snapshot.model, tmp / "model.safetensors")
        if snapshot.optimizer is not None:
            write_safetensors(snapshot.optimizer, tmp / OPTIMIZER_FILE)
        for name, text in sorted(snapshot.documents.items(), key=lambda kv: kv[0] == "state.json"):
            (tmp / name).write_text(text)  # state.json last: its presence marks a complete folder
        fsync_tree(tmp)
        move_into_place(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


# safetensors' names for the dtypes a checkpoint holds
SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A safetensors file (read back by safetensors.torch.load_file) written straight from the
    tensors' memory: safetensors' own save_file builds the whole file in memory first, an extra
    copy of every byte, and holds the GIL while it does, which the training thread needs."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        size = t.numel() * t.element_size()
        entry = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        header[name] = entry
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in names:
            t = tensors[name]
            if t.numel():  # little-endian bytes as they lie in memory; one write, the GIL released
                f.write(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)


def fsync_tree(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def move_into_place(tmp: Path, path: Path) -> None:
    """Rename the finished folder `tmp` to `path`, replacing a folder already there."""
    if path.exists():  # a directory cannot be renamed over a non-empty one: move the old aside
        old = path.parent / f"{path.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def has_optimizer_state(path: Path) -> bool:
    """The folder keeps its optimizer's tensors (older kept checkpoints drop them: see
    trainer.checkpoint.drop_optimizer_state)."""
    return (Path(path) / OPTIMIZER_FILE).exists()
