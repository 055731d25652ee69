"""How a job fails: `JobFailure` (code, message the user can act on, param) and
`classify_exception`, which maps an exception from data preparation or training to one of
`invalid_training_file`, `training_diverged`, `invalid_hyperparameters`, `out_of_memory` or
`internal_error`."""

from __future__ import annotations

import re

from trainer.config import ConfigError
from trainer.data.formats import DataError


class JobFailure(Exception):
    """Ends the job as `failed` with this code/message/param (a message the user can act on)."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def data_failure(exc: DataError, has_validation_file: bool) -> JobFailure:
    """A data problem, naming the input it is about: the training file, the validation file, or
    val_fraction (the validation data it split off the training file)."""
    param = "training_file"
    if exc.validation:
        param = "validation_file" if has_validation_file else "val_fraction"
    return JobFailure("invalid_training_file", exc.message, param)


def classify_exception(exc: BaseException, has_validation_file: bool = False) -> JobFailure:
    """Map an exception from data preparation or training to the job's error."""
    from trainer.run.report import TrainingDiverged

    if isinstance(exc, TrainingDiverged):
        return JobFailure("training_diverged", str(exc))
    if isinstance(exc, DataError):
        return data_failure(exc, has_validation_file)
    if isinstance(exc, ConfigError):
        return JobFailure("invalid_hyperparameters", f"The job's configuration was refused: {exc}", exc.param)
    if is_out_of_memory(exc):
        return out_of_memory(exc)
    # Only the exception's type: its text can hold SQL, parameters or paths (the worker logs it).
    return JobFailure(
        "internal_error",
        f"The worker hit an internal error ({type(exc).__name__}). "
        "Retrying the job may help; if it fails again, report it with the job id.",
    )


# What the allocators say when they run out: torch's CUDA caching allocator ("CUDA out of memory",
# torch.OutOfMemoryError), its CPU allocator ("DefaultCPUAllocator: can't allocate memory: you tried
# to allocate N bytes"), cuBLAS/cuDNN failing to allocate their workspace, MPS ("MPS backend out of memory").
OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory", "alloc_failed")


def is_out_of_memory(exc: BaseException) -> bool:
    """A memory allocation failed (MemoryError covers numpy's and Python's own)."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in text for m in OOM_MESSAGES)


def out_of_memory(exc: BaseException) -> JobFailure:
    """The job asked for more memory than its worker has: what to lower, never "retry" (it would
    run out again). The API refuses jobs whose estimate exceeds the largest worker
    (api.job_limits), so this is a job close to that limit, or a worker smaller than configured."""
    return JobFailure(
        "out_of_memory",
        f"Training ran out of memory: {_failed_allocation(str(exc))}. Lower batch_size (raise grad_accum "
        "to keep the same batch per step), ctx, or the model size (n_embd, n_layer), or set "
        "activation_checkpointing=true.",
    )


def _failed_allocation(text: str) -> str:
    """The size the allocator could not get, from its message (never the message itself)."""
    if m := re.search(r"allocate (\d+) bytes", text):  # torch's CPU allocator
        return f"an allocation of {int(m.group(1)) / (1 << 30):,.1f} GiB failed"
    if m := re.search(r"allocate (\d+(?:\.\d+)? [KMGT]iB)", text, re.IGNORECASE):  # CUDA, MPS
        return f"an allocation of {m.group(1)} failed"
    return "an allocation failed"
