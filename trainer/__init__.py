"""fromscratch's trainer: a pure-torch library (no web, SQL or Celery imports; a test enforces it).

Names are re-exported lazily so `import trainer` (e.g. for `trainer.config` in the API) does not
import torch until something that needs it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "ModelConfig": "trainer.config",
    "TrainConfig": "trainer.config",
    "ConfigError": "trainer.config",
    "PRESETS": "trainer.config",
    "Llama": "trainer.model",
    "train": "trainer.loop",
    "launch_train": "trainer.distributed",
    "Callbacks": "trainer.loop",
    "TrainResult": "trainer.loop",
    "TrainingDiverged": "trainer.loop",
    "generate": "trainer.sampling",
    "generate_ids": "trainer.sampling",
    "save_checkpoint": "trainer.checkpoint",
    "load_checkpoint": "trainer.checkpoint",
    "load_model": "trainer.checkpoint",
    "lr_at": "trainer.optim",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value
