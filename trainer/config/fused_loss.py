"""When the training loss runs fused with the output projection (trainer.model.linear_cross_entropy):
the one rule that the model and the memory estimate (trainer.config.estimate) both ask. Torch-free,
since the API estimates a job's memory before anything imports torch.

Why only CUDA by default: there the float32 logits of a step and their gradient are the largest
activation (2 x 2.1 GB for 16k tokens at a 32k vocabulary), and the fused path never builds them.
On the CPU, at the byte vocabulary most jobs there use, a step timed 1-2% slower with it (faster
from a 4096-token vocabulary on), so the CPU keeps the plain path unless asked.
"""

from __future__ import annotations

import os

ENV = "FROMSCRATCH_FUSED_CROSS_ENTROPY"  # "1" / "0": on / off on every device (A/B runs, tests)
DEFAULT_DEVICES = frozenset({"cuda"})
# float16 is left out: its gradients are computed in the forward, before the gradient scaler's
# factor reaches them, so small ones would underflow; float64 (numerics checks) keeps exact ops.
DTYPES = frozenset({"float32", "bfloat16"})
CHUNK_BYTES = 256 << 20  # bound on one chunk's float32 logits


def fused_cross_entropy_on(device_type: str, dtype: str) -> bool:
    """Whether a training loss on `device_type` ("cpu", "cuda") with matmuls in `dtype` (a torch
    dtype's name: "float32", "bfloat16"...) runs fused. Read at every call (not cached), so a test
    or an A/B script can flip the variable within one process."""
    if dtype not in DTYPES:
        return False
    forced = os.environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return device_type in DEFAULT_DEVICES


def chunk_rows(n_rows: int, vocab_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: as many as keep a chunk's float32 logits within chunk_bytes, at least one."""
    return max(1, min(n_rows, chunk_bytes // (4 * vocab_size)))
