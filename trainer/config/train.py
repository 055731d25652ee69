"""Training: TrainConfig, everything about a run that is not architecture."""

from __future__ import annotations

from typing import Any

from trainer.config.fields import StrictConfig
from trainer.config.learning_groups import (
    MAX_STEPS,
    DataFields,
    InitFields,
    OptimizerFields,
    ScheduleFields,
    default_learning_rate,
)
from trainer.config.run_groups import CheckpointFields, EvaluationFields, RuntimeFields

__all__ = ["MAX_STEPS", "TRAIN_GROUPS", "TrainConfig", "group_of"]


# TrainConfig is built from one class per concern; `TRAIN_GROUPS` names them in the order the CLI's
# --help, the JSON Schema (x-group) and docs list them. The config itself stays flat: field `x_y` is
# CLI option `--x-y`, API hyperparameter `x_y` and key `x_y` of a checkpoint's train config.


TRAIN_GROUPS: dict[str, type[StrictConfig]] = {
    "model": InitFields,
    "data": DataFields,
    "optimizer": OptimizerFields,
    "schedule": ScheduleFields,
    "evaluation": EvaluationFields,
    "checkpointing": CheckpointFields,
    "runtime": RuntimeFields,
}


class TrainConfig(
    RuntimeFields, CheckpointFields, EvaluationFields, ScheduleFields, OptimizerFields, DataFields, InitFields
):
    """Everything about a run that is not architecture: the fields of every group in TRAIN_GROUPS,
    flat, with the rules that span groups."""

    def __init__(self, **values: Any) -> None:
        if "learning_rate" not in values:  # the optimizer's own default (L-BFGS's is not AdamW's)
            values["learning_rate"] = default_learning_rate(values.get("optimizer"))
        super().__init__(**values)

    def _cross_field_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if self.tokenizer == "bpe" and self.vocab_size is not None and not 260 <= self.vocab_size <= 65536:
            problems.append(("vocab_size", f"bpe vocab_size must be in [260, 65536], got {self.vocab_size}"))
        if self.tokenizer == "byte" and self.vocab_size not in (None, 258):
            problems.append(
                (
                    "vocab_size",
                    "the byte tokenizer has a fixed vocabulary of 258; set tokenizer bpe for another size",
                )
            )
        if self.sharding == "fsdp" and self.dtype == "float16":
            problems.append(
                ("dtype", "float16 needs a gradient scaler, which sharding fsdp does not use; use bfloat16")
            )
        if self.devices > 1 and self.optimizer == "lbfgs":
            problems.append(("devices", "L-BFGS trains in one process; use devices 1 or optimizer adamw"))
        if self.devices > 1 and self.sharding == "fsdp" and self.optimizer == "muon":
            problems.append(("sharding", "optimizer muon needs whole matrices, which fsdp shards; use ddp"))
        if self.min_lr is not None and self.min_lr > self.learning_rate:
            problems.append(("min_lr", f"must be <= learning_rate ({self.learning_rate}), got {self.min_lr}"))
        if self.early_stopping_patience and self.eval_every == 0:  # unset (auto) evaluates when it can
            problems.append(
                ("early_stopping_patience", "counts evaluations: set eval_every > 0, or use 0 (off)")
            )
        return problems

    # dropout, eval_every and early_stopping_patience: `auto` (None) is decided from the data when a
    # run starts (trainer.config.data_aware); what reads them during a run reads the decision
    @property
    def resolved_dropout(self) -> float:
        return _decided("dropout", self.dropout)

    @property
    def resolved_eval_every(self) -> int:
        return int(_decided("eval_every", self.eval_every))

    @property
    def resolved_early_stopping_patience(self) -> int:
        return int(_decided("early_stopping_patience", self.early_stopping_patience))

    @property
    def resolved_min_lr(self) -> float:
        return self.learning_rate / 10 if self.min_lr is None else self.min_lr

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        # configs stored before the reserved, never-used `extra` field was dropped still load
        return cls(**{k: v for k, v in d.items() if k != "extra"})


def _decided(field: str, value: float | None) -> float:
    if value is None:
        raise ValueError(
            f"{field} auto is decided when the run starts (trainer.config.data_aware.resolve_auto)"
        )
    return value


def group_of(field: str) -> str:
    """The TRAIN_GROUPS key of a TrainConfig field."""
    return next(name for name, group in TRAIN_GROUPS.items() if field in group.model_fields)
