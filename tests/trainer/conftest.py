"""Fixtures for the trainer-loop tests: tiny models on small data, so each test takes seconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.config import ModelConfig, TrainConfig

torch.set_num_threads(2)  # the CI machine has 2 cores shared with other jobs

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SHAKESPEARE = DATA_DIR / "tiny_shakespeare_100k.txt"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """@pytest.mark.cuda(devices=N): skip, saying why, on a machine with fewer CUDA devices."""
    marker = item.get_closest_marker("cuda")
    if marker is None:
        return
    need = int(marker.kwargs.get("devices", 1))
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < need:
        pytest.skip(f"cuda marker: needs {need} CUDA device(s), this machine has {have}")


@pytest.fixture
def shakespeare() -> Path:
    return SHAKESPEARE


@pytest.fixture(scope="session")
def byte_tokenizer() -> Any:
    from trainer.data.tokenizers import ByteTokenizer

    return ByteTokenizer()


@pytest.fixture(scope="session")
def shakespeare_data(byte_tokenizer: Any) -> Any:
    """Byte-tokenized tiny Shakespeare, 10% held out (prepared once per session)."""
    from trainer.data.prepare import prepare_data

    return prepare_data(SHAKESPEARE, byte_tokenizer, val_fraction=0.1)


@pytest.fixture
def tiny_model() -> Callable[..., ModelConfig]:
    def make(**kw: Any) -> ModelConfig:
        values = dict(n_layer=1, n_head=2, n_embd=32, ctx=32, vocab_size=258)
        values.update(kw)
        return ModelConfig(**values)

    return make


@pytest.fixture
def tiny_train() -> Callable[..., TrainConfig]:
    def make(**kw: Any) -> TrainConfig:
        values: dict[str, Any] = dict(
            max_steps=8,
            batch_size=4,
            learning_rate=3e-3,
            warmup_steps=2,
            eval_every=0,
            eval_batches=2,
            checkpoint_every=0,
            device="cpu",
            # exact numerics: float32 whatever dtype auto would pick here (bfloat16 on a CPU with
            # native bf16 that a timing probe finds faster; tests/trainer/test_precision.py tests auto)
            dtype="float32",
            # the data-aware `auto` settings pinned: the tests of other things stay exact and
            # independent of trainer.config.data_aware's rules (tests/trainer/test_data_aware.py)
            dropout=0.0,
            early_stopping_patience=0,
        )
        values.update(kw)
        return TrainConfig(**values)

    return make


def read_metrics(out_dir: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def train_losses(out_dir: Path) -> list[float]:
    return [m["train_loss"] for m in read_metrics(out_dir) if "train_loss" in m]
