"""The models an inference worker keeps loaded: an LRU of at most `max_loaded_models` per process,
shared by the threads of its pool.

A checkpoint blob (a tar, folder at its root) is extracted once to `work_dir/models/<blob id>/`:
written to a temporary folder beside it, marked complete, then renamed, so a crash never leaves
half a model there and several processes may race for it (the first rename wins). It is loaded
with trainer.checkpoint.load_model and placed on the worker's inference device (bfloat16 on CUDA:
worker.inference_device), in eval mode; the threads share it (a forward pass
changes nothing in the model, each completion has its own KV cache). One thread loads a
checkpoint while the others asking for the same one wait for it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tarfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from core.archives import extract_all
from worker.inference_device import InferenceDevice, inference_device

if TYPE_CHECKING:
    from core.blobstore import BlobStore
    from trainer.data.tokenizers import Tokenizer
    from trainer.model.llama import Llama

COMPLETE_MARKER = ".complete"


class ModelCache:
    def __init__(self, max_loaded: int, device: InferenceDevice | None = None) -> None:
        self.max_loaded = max_loaded
        self.device = device or InferenceDevice("cpu")
        self._models: OrderedDict[str, tuple[Llama, Tokenizer]] = OrderedDict()
        self._guard = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}  # blob id -> held by the thread loading it

    def get(self, blob_id: str, store: BlobStore, work_dir: Path) -> tuple[Llama, Tokenizer]:
        """The model and tokenizer of the checkpoint blob `blob_id`, loaded once."""
        with self._guard:
            if blob_id in self._models:
                self._models.move_to_end(blob_id)
                return self._models[blob_id]
            lock = self._loading.setdefault(blob_id, threading.Lock())
        with lock:
            with self._guard:
                if blob_id in self._models:  # loaded by the thread we waited for
                    self._models.move_to_end(blob_id)
                    return self._models[blob_id]
            from trainer.checkpoint import load_model

            model, tokenizer = load_model(checkpoint_dir(blob_id, store, work_dir), device="cpu")
            model = self.device.place(model)
            with self._guard:
                self._models[blob_id] = (model, tokenizer)
                while len(self._models) > self.max_loaded:
                    self._models.popitem(last=False)
                self._loading.pop(blob_id, None)
            return model, tokenizer


def checkpoint_dir(blob_id: str, store: BlobStore, work_dir: Path) -> Path:
    """The checkpoint folder of blob `blob_id` under work_dir/models/<blob id>/, extracted once."""
    root = work_dir / "models"
    final = root / blob_id
    if (final / COMPLETE_MARKER).exists():
        return find_checkpoint(final)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{blob_id}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tar_path = store.read_to_path(blob_id, tmp / "checkpoint.tar")
        with tarfile.open(tar_path) as tf:
            extract_all(tf, tmp / "ckpt")  # no links out, no absolute paths
        tar_path.unlink()
        find_checkpoint(tmp)  # refuse a blob that is no checkpoint before it is kept
        (tmp / COMPLETE_MARKER).touch()
        if final.exists() and not (final / COMPLETE_MARKER).exists():
            shutil.rmtree(final, ignore_errors=True)  # an unmarked leftover: replace it
        try:
            os.replace(tmp, final)
        except OSError:  # another thread or process renamed its copy first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return find_checkpoint(final)


def find_checkpoint(folder: Path) -> Path:
    for config in sorted(folder.rglob("config.json")):
        if (config.parent / "model.safetensors").exists():
            return config.parent
    raise FileNotFoundError(f"the stored checkpoint under {folder} holds no config.json + model.safetensors")


_caches: dict[tuple[int, str], ModelCache] = {}
_caches_lock = threading.Lock()


def model_cache(max_loaded: int, device: str = "cpu") -> ModelCache:
    """This process's cache (one per `max_loaded_models` value and `inference_device` setting: in
    practice one)."""
    with _caches_lock:
        key = (max_loaded, device)
        if key not in _caches:
            _caches[key] = ModelCache(max_loaded, inference_device(device))
        return _caches[key]
