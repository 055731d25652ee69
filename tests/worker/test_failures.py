"""worker.failures: a job that runs out of memory fails as `out_of_memory` with what to lower,
whichever allocator ran out, and never tells the user that retrying may help."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from worker.failures import classify_exception


def real_cpu_allocator_failure() -> RuntimeError:
    """What torch's CPU allocator raises for an allocation no machine can satisfy."""
    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 62, dtype=torch.uint8)
    return info.value


def real_numpy_failure() -> MemoryError:
    with pytest.raises(MemoryError) as info:
        np.empty(1 << 62, dtype=np.uint8)
    return info.value


@pytest.mark.parametrize(
    ("make", "size"),
    [
        (real_cpu_allocator_failure, "4,294,967,296.0 GiB"),
        (real_numpy_failure, None),
        (lambda: MemoryError(), None),
        (
            lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ..."),
            "2.00 GiB",
        ),
        (lambda: RuntimeError("CUDA error: out of memory"), None),
        (
            lambda: RuntimeError(
                "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
            ),
            None,
        ),
        (lambda: RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GB)"), None),
        (
            lambda: RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                "you tried to allocate 1030792151040 bytes. Error code 12 (Cannot allocate memory)"
            ),
            "960.0 GiB",
        ),
    ],
    ids=["torch-cpu", "numpy", "MemoryError", "cuda", "cuda-runtime", "cublas", "mps", "issue-9-n_embd"],
)
def test_out_of_memory_says_what_to_lower(make: Callable[[], BaseException], size: str | None) -> None:
    failure = classify_exception(make())
    assert failure.code == "out_of_memory"
    for setting in ("batch_size", "ctx", "n_embd", "n_layer", "activation_checkpointing=true"):
        assert setting in failure.message
    assert "retry" not in failure.message.lower()
    assert "enforce fail" not in failure.message and "alloc_cpu" not in failure.message  # no internals
    if size is not None:
        assert f"an allocation of {size} failed" in failure.message


def test_other_runtime_errors_stay_internal() -> None:
    failure = classify_exception(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert failure.code == "internal_error"
    assert classify_exception(ValueError("out of memory")).code == "internal_error"  # only allocator errors
