"""What every experiment tracker implements (`Tracker`), and what it is given.

A tracker is driven by one background thread per job (worker.integrations.trackers.Trackers):
`start` once, `log` with batches of steps at the metrics flush cadence, `finish` once. Any
exception it raises turns it off for the rest of the job (one `warn` event says why); raise
`TrackerError` with a message the job's owner can act on.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config.metrics import STORED

# Metric row column -> the trackers' name for it; the names whose summary is the run's highest value
TRACKER_NAMES: dict[str, str] = {spec.name: spec.tracker for spec in STORED if spec.tracker}
SUMMARIZED_BY_MAX = frozenset(spec.tracker for spec in STORED if spec.tracker and spec.aggregate == "max")

# one step's metrics, by tracker name: (step, {name: value})
TrackedStep = tuple[int, dict[str, float]]


class TrackerError(Exception):
    """A tracker cannot go on; the message says why (it becomes the job's warn event)."""


@dataclass
class RunInfo:
    """What a tracker's run starts with."""

    job_id: str
    model: str  # what the job trains from: a preset or a model id
    fine_tuned_model: str  # the id the trained model will have
    config: dict[str, Any]  # {"model": ModelConfig dict, "train": TrainConfig dict}
    hyperparameters: dict[str, Any]  # as the job was created with them
    start_step: int  # 0, or the checkpoint step this attempt resumes from
    work_dir: Path  # the worker's work_dir (trackers' local files live under it)

    def params(self) -> dict[str, str]:
        """Flat string parameters: `job_id`, `model`, `model.<field>`, `train.<field>`."""
        out = {"job_id": self.job_id, "model": self.model, "fine_tuned_model": self.fine_tuned_model}
        for part in ("model", "train"):
            for name, value in sorted((self.config.get(part) or {}).items()):
                if value is not None and name != "extra":
                    out[f"{part}.{name}"] = str(value)
        return out


@dataclass
class RunEnd:
    """How the attempt ended."""

    status: str | None  # the job's status (core.status.JobStatus); None: the lease was lost
    final_folder: Path | None  # the final checkpoint folder of a succeeded job
    summary: dict[str, float] = field(default_factory=dict)  # each metric's value over the run (summarize)


class Tracker(ABC):
    kind: str  # "wandb" | "mlflow": the integration's type

    @property
    def label(self) -> str:
        """How events name this integration."""
        return self.kind

    @abstractmethod
    def start(self, run: RunInfo) -> None: ...

    @abstractmethod
    def log(self, steps: list[TrackedStep]) -> None: ...

    @abstractmethod
    def finish(self, end: RunEnd) -> None: ...


def tracked_steps(rows: Mapping[int, Mapping[str, float | None]]) -> list[TrackedStep]:
    """Buffered metric rows ({step: {column: value}}) as the trackers log them, in step order;
    absent and non-finite values left out, steps with nothing left dropped."""
    out = []
    for step in sorted(rows):
        values = {}
        for column, name in TRACKER_NAMES.items():
            value = rows[step].get(column)
            if value is not None and math.isfinite(value):
                values[name] = float(value)
        if values:
            out.append((step, values))
    return out


def summarize(summary: dict[str, float], steps: list[TrackedStep]) -> None:
    """Fold logged steps into the run's summary: each metric's last value, or its highest for a
    metric the registry aggregates by "max"."""
    for _, values in steps:
        for name, value in values.items():
            summary[name] = max(value, summary.get(name, value)) if name in SUMMARIZED_BY_MAX else value
