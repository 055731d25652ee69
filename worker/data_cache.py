"""A job's training data on the worker's disk, cached under `work_dir/cache/` so repeated jobs on
the same content skip the work:

- `files/<sha256>`: the uploaded file, downloaded from the blob store once per content and
  validated (`fetch_file`);
- `tokenizers/<sha256>-<kind>-<vocab>.json`: the tokenizer trained on it (`job_tokenizer`; a BPE
  on a bounded sample of the file, trainer.data.text_sample);
- `tokens/`: the tokenized data, per (file sha256, tokenizer hash) (`prepare_tokens`, via
  `trainer.data.prepare.prepare_data`), as memmaps.

Every step streams the file, whatever its size: the download, validation, sha256 and tokenization
hold a MiB or so of it at a time, a BPE's training a sample of about 8 Mi characters at most. A
worker preparing a 1 GiB upload stays within a few hundred MB (bench/upload_rss.py measures it).

Data problems become `JobFailure("invalid_training_file", ...)` naming the file (worker.failures.data_failure).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from core.models import File
from trainer.config import TrainConfig
from trainer.data.formats import DataError, validate_file
from worker.failures import JobFailure, data_failure

if (
    TYPE_CHECKING
):  # types only (trainer.data.prepare and trainer.data.tokenizers are imported when first needed)
    from core.blobstore import BlobStore
    from trainer.data.prepare import TokenData
    from trainer.data.tokenizers import Tokenizer


def fetch_file(
    session_factory: sessionmaker[Session], store: BlobStore, cache_dir: Path, file_id: str, param: str
) -> Path:
    """Download a File's blob into the content-addressed cache (once) and validate it."""
    with session_factory() as session:
        file = session.get(File, file_id)
        if file is None or file.blob_id is None:  # no row, or its bytes freed by a delete
            raise JobFailure(
                "invalid_training_file",
                f"The {param.replace('_', ' ')} {file_id} no longer exists; "
                "upload it again and create a new job.",
                param,
            )
        blob_id, sha, name = file.blob_id, file.sha256, file.filename
    path = cache_dir / "files" / sha
    if not _touched(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{sha}.tmp-{os.getpid()}")
        store.read_to_path(blob_id, tmp)
        os.replace(tmp, path)
    try:
        validate_file(path)
    except DataError as exc:
        raise JobFailure("invalid_training_file", f"{name}: {exc.message}", param) from exc
    return path


def job_tokenizer(cache_dir: Path, train_path: Path, sha256: str, cfg: TrainConfig) -> Tokenizer:
    """The tokenizer for this data: cached per (file sha256, kind, vocab size)."""
    from trainer.data.formats import iter_documents
    from trainer.data.tokenizers import tokenizer_from_json, train_tokenizer

    vocab = cfg.resolved_vocab_size
    if cfg.tokenizer == "byte":
        return train_tokenizer("byte", vocab, [])
    path = cache_dir / "tokenizers" / f"{sha256}-{cfg.tokenizer}-{vocab}.json"
    if _touched(path):
        return tokenizer_from_json(json.loads(path.read_text()))
    tokenizer = train_tokenizer(cfg.tokenizer, vocab, iter_documents(train_path))
    _write_json_atomic(path, tokenizer.to_json())
    return tokenizer


def tokenizer_of(checkpoint: Path) -> Tokenizer:
    """The tokenizer stored in a checkpoint folder (resume / continue training keep it)."""
    from trainer.data.tokenizers import tokenizer_from_json

    return tokenizer_from_json(json.loads((checkpoint / "tokenizer.json").read_text()))


def prepare_tokens(
    cache_dir: Path, train_path: Path, val_path: Path | None, tokenizer: Tokenizer, cfg: TrainConfig
) -> TokenData:
    """Tokenize (or reuse the cached tokens of) the training and validation files: a TokenData."""
    from trainer.data.prepare import prepare_data

    try:
        return prepare_data(
            train_path,
            tokenizer,
            validation_path=val_path,
            val_fraction=cfg.val_fraction,
            cache_dir=cache_dir / "tokens",
        )
    except DataError as exc:
        raise data_failure(exc, has_validation_file=val_path is not None) from exc


def _touched(path: Path) -> bool:
    """Whether the cache holds `path`; marked used now if so, which keeps worker.cache_sweep off it."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    return True


def _write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)
