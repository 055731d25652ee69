"""What compiling cost and gained on this machine before (issue 23): compile auto's payback sum
needs the seconds regional compilation takes and the speedup it gives, and both depend on the
device, the model's shape and whether inductor's cache already holds the kernels (a second job of
the same shape compiles in seconds). A worker keeps them in a JSON file (the path in the
FROMSCRATCH_COMPILE_MEMORY environment variable, set by worker/cli.py beside its inductor cache);
without it, or for a device kind never measured, the figures measured once (REGIONAL_COMPILE)
stand in.

Lookup order: this shape on this device kind; else the newest figures of any shape on this kind;
else REGIONAL_COMPILE. The file is replaced atomically, so workers sharing it never read half a
file (the last writer wins)."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from trainer.config import ModelConfig

ENV = "FROMSCRATCH_COMPILE_MEMORY"
# Regional compilation as measured (issue 23): (seconds compiling costs, eager step time / compiled
# step time), llama-110m ctx 1024 batch 16 bf16. H100 (2026-11-27, with the Triton kernels eager):
# compiling took 19.4 s, steps 34 vs 50 ms. H200 (before them): 10.3 s vs 2.3 s first step, 25.4 vs
# 48.2 ms. CUDA takes the H100's, the dearer: a run too short to pay it back stays eager. 2-core
# AVX2 CPU, llama-15m ctx 128 batch 4 fp32: 32.2 s vs 2.3 s, 2.63 vs 2.94 s.
REGIONAL_COMPILE = {"cuda": (19.4, 1.47), "cpu": (30.0, 1.12)}


@dataclass(frozen=True)
class CompileFigures:
    cost_s: float  # seconds compiling adds to the run
    speedup: float  # eager step time / compiled step time
    source: str  # where they come from, for the decision's sentence


def default_figures(device_type: str) -> CompileFigures | None:
    if device_type not in REGIONAL_COMPILE:
        return None
    cost, speedup = REGIONAL_COMPILE[device_type]
    return CompileFigures(cost, speedup, f"as measured once on a {device_type.upper()}")


class CompileMemory:
    def __init__(self, path: Path):
        self.path = path

    def _read(self) -> dict[str, dict[str, dict[str, float]]]:
        with suppress(OSError, ValueError):
            doc = json.loads(self.path.read_text())
            if isinstance(doc, dict):
                return doc
        return {}

    def figures(self, device_type: str, shape: str) -> CompileFigures | None:
        kind = self._read().get(device_type, {})
        if isinstance(found := kind.get(shape), dict):
            return CompileFigures(found["cost_s"], found["speedup"], "measured here on this shape")
        if isinstance(newest := kind.get("newest"), dict):
            return CompileFigures(newest["cost_s"], newest["speedup"], "measured here on another shape")
        return default_figures(device_type)

    def remember(self, device_type: str, shape: str, cost_s: float, speedup: float) -> None:
        doc = self._read()
        entry = {"cost_s": round(cost_s, 3), "speedup": round(speedup, 4)}
        doc.setdefault(device_type, {}).update({shape: entry, "newest": entry})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".compile-memory-")
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(tmp, self.path)


def shape_key(model_cfg: ModelConfig, batch_size: int, dtype: str) -> str:
    """What decides the compiled kernels: the model's shape, the micro-batch and the dtype."""
    m = model_cfg
    return (
        f"L{m.n_layer} d{m.n_embd} h{m.n_head}/{m.n_kv_head} ffn{m.hidden_dim} ctx{m.ctx} "
        f"v{m.vocab_size} b{batch_size} {dtype}"
    )


def compile_memory() -> CompileMemory | None:
    """The memory the environment names (None: figures are not remembered)."""
    path = os.environ.get(ENV)
    return CompileMemory(Path(path)) if path else None
