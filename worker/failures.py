"""How a job fails: `JobFailure` (code, message the user can act on, param) and
`classify_exception`, which maps an exception from data preparation or training to one of
`invalid_training_file`, `training_diverged`, `invalid_hyperparameters`, `out_of_memory` or
`internal_error`."""

from __future__ import annotations

from trainer.config import ConfigError
from trainer.dataformat import DataError


class JobFailure(Exception):
    """Ends the job as `failed` with this code/message/param (a message the user can act on)."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def classify_exception(exc: BaseException) -> JobFailure:
    """Map an exception from data preparation or training to the job's error."""
    from trainer.loop import TrainingDiverged

    if isinstance(exc, TrainingDiverged):
        return JobFailure("training_diverged", str(exc))
    if isinstance(exc, DataError):
        return JobFailure("invalid_training_file", exc.message, "training_file")
    if isinstance(exc, ConfigError):
        return JobFailure("invalid_hyperparameters", f"The job's configuration was refused: {exc}", exc.param)
    if _is_oom(exc):
        return JobFailure(
            "out_of_memory",
            "Training ran out of memory. Lower batch_size (raise grad_accum to keep "
            "the same effective batch), ctx or the model size, or train in bfloat16.",
        )
    return JobFailure(
        "internal_error",
        f"The worker hit an internal error ({type(exc).__name__}: {exc}). "
        "Retrying the job may help; if it fails again, report it with the job id.",
    )


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
