"""User-visible model ids, OpenAI style:

    final model:  ft:<root preset>[:<suffix>]:<job id hex>
    checkpoint:   ft:<root preset>[:<suffix>]:<job id hex>:ckpt-step-<step>

The root preset is the preset the lineage started from: a job continuing from `ft:llama-tiny:...`
is still `ft:llama-tiny:...`. Suffixes must not contain ':' (the API validates that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

PREFIX = "ft"
CKPT_PREFIX = "ckpt-step-"


class _JobLike(Protocol):
    id: str
    model: str
    suffix: str | None


@dataclass(frozen=True)
class ModelId:
    root: str
    suffix: str | None
    job_hex: str
    step: int | None  # None for the final model

    @property
    def job_id(self) -> str:
        return f"ftjob-{self.job_hex}"


def root_preset(model: str) -> str:
    """The preset at the root of a lineage: `llama-tiny` for `llama-tiny` or `ft:llama-tiny:...`."""
    if model.startswith(PREFIX + ":"):
        return model.split(":")[1]
    return model


def job_hex(job_id: str) -> str:
    return job_id.rsplit("-", 1)[-1]


def final_model_id(job: _JobLike) -> str:
    parts = [PREFIX, root_preset(job.model)]
    if job.suffix:
        parts.append(job.suffix)
    parts.append(job_hex(job.id))
    return ":".join(parts)


def checkpoint_model_id(job: _JobLike, step: int) -> str:
    return f"{final_model_id(job)}:{CKPT_PREFIX}{step}"


def parse_model_id(model_id: str) -> ModelId | None:
    """Split a fine-tuned model id into its parts; None if it is not one of ours."""
    parts = model_id.split(":")
    if len(parts) < 3 or parts[0] != PREFIX:
        return None
    step: int | None = None
    if parts[-1].startswith(CKPT_PREFIX):
        digits = parts[-1][len(CKPT_PREFIX) :]
        if not digits.isdigit():
            return None
        step = int(digits)
        parts = parts[:-1]
    if len(parts) not in (3, 4) or not parts[1] or not parts[-1]:
        return None
    suffix = parts[2] if len(parts) == 4 else None
    return ModelId(root=parts[1], suffix=suffix, job_hex=parts[-1], step=step)
