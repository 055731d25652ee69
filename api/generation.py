"""`POST /v1/models/{id}/generate`: sample text from a trained model or any checkpoint.

The checkpoint blob is extracted once to `work_dir/models/<blob id>/` (written to a temp folder,
then renamed, so a crash never leaves half a model there) and loaded with
trainer.checkpoint.load_model on the CPU. Loaded models stay in a small LRU (`MAX_LOADED`); a
checkpoint is loaded by one thread while others asking for it wait. Generation runs in the
request's worker thread (FastAPI's threadpool), never on the event loop.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from api.exports import extract_checkpoint_tar

if TYPE_CHECKING:  # types only: importing trainer.model would load torch into the API process
    from core.blobstore import BlobStore
    from trainer.model import Llama
    from trainer.tokenizers import Tokenizer

MAX_LOADED = 4


class ModelCache:
    def __init__(self, max_loaded: int = MAX_LOADED) -> None:
        self.max_loaded = max_loaded
        self._models: OrderedDict[str, tuple[Llama, Tokenizer]] = OrderedDict()
        self._guard = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def _checkpoint_dir(self, blob_id: str, store: BlobStore, work_dir: Path) -> Path:
        root = work_dir / "models"
        final = root / blob_id
        marker = final / ".complete"
        if marker.exists():
            return _find_ckpt(final)
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f"{blob_id}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tar_path = store.read_to_path(blob_id, tmp / "checkpoint.tar")
            extract_checkpoint_tar(tar_path, tmp / "ckpt")
            tar_path.unlink()
            (tmp / ".complete").touch()
            if final.exists():  # a stale partial folder from an older layout: replace it
                shutil.rmtree(final, ignore_errors=True)
            try:
                os.replace(tmp, final)
            except OSError:  # another process won the rename
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return _find_ckpt(final)

    def get(self, blob_id: str, store: BlobStore, work_dir: Path) -> tuple[Llama, Tokenizer]:
        with self._guard:
            if blob_id in self._models:
                self._models.move_to_end(blob_id)
                return self._models[blob_id]
            lock = self._loading.setdefault(blob_id, threading.Lock())
        with lock:
            with self._guard:
                if blob_id in self._models:
                    return self._models[blob_id]
            from trainer.checkpoint import load_model

            model, tokenizer = load_model(self._checkpoint_dir(blob_id, store, work_dir), device="cpu")
            model.eval()
            with self._guard:
                self._models[blob_id] = (model, tokenizer)
                while len(self._models) > self.max_loaded:
                    self._models.popitem(last=False)
                self._loading.pop(blob_id, None)
            return model, tokenizer


def _find_ckpt(folder: Path) -> Path:
    for config in sorted(folder.rglob("config.json")):
        if (config.parent / "model.safetensors").exists():
            return config.parent
    raise FileNotFoundError(f"no checkpoint folder under {folder}")


def generate_text(
    cache: ModelCache,
    blob_id: str,
    store: BlobStore,
    work_dir: Path,
    *,
    prompt: str,
    max_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
) -> tuple[str, int, int]:
    """Returns (text, prompt_tokens, completion_tokens): the counts are of the tokens the model
    read and generated (trainer.sampling.complete), not of the text encoded again."""
    from trainer.sampling import complete

    model, tokenizer = cache.get(blob_id, store, work_dir)
    return complete(
        model,
        tokenizer,
        prompt,
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
    )
