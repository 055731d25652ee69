"""The one registry of training metrics: every metric the trainer measures is declared once, in
`METRICS`, with each name it goes by and how it is read. Everything that writes or reads metrics
derives its table from here: metrics.jsonl (trainer.run.metrics_file), the callbacks' dataclasses
below, the Metric rows and the job's progress columns (worker.callbacks, worker.metric_rows), the
events' `data`, GET /metrics points and the SSE stream (api.schemas), checkpoint metrics, the
results CSV (worker.result_file), the experiment trackers (worker.integrations.base) and TensorBoard
(api.tensorboard_events).

A metric's names:
- `name`: the trainer's own: the field of its phase's dataclass, the key in metrics.jsonl and, for a
  stored metric, the Metric row's column (core.models.Metric) and the key of a GET /metrics point;
- `openai`: in OpenAI's shapes, an event's `data` and a checkpoint's `metrics`;
- `csv`, `tracker`, `tensorboard`: the results CSV's column, the W&B / MLflow metric and the
  TensorBoard tag (None: not there);
- `progress`: the job's progress column (core.models.Job) the newest value is copied to.

Adding a metric: its entry below, its field in the dataclass of its phase, and where it is measured;
a stored one also needs its Metric column (core.models) and a migration. The import-time check at
the bottom keeps the entries and the dataclasses the same set.

Torch-free, like the rest of trainer.config: the API, the worker and core import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal

# When the loop measures it: every log_every steps (Callbacks.on_step), at each evaluation
# (on_eval) or in the final full validation pass (on_full_eval); `system` ones the worker samples on
# each metrics flush (worker.system_metrics), onto the newest step's row.
Phase = Literal["step", "eval", "full_eval", "system"]
# How a run's series of values sums up into one (the trackers' run summary).
Aggregate = Literal["last", "max"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    phase: Phase
    unit: str
    label: str  # how a message names it, within its phase ("loss", "token accuracy")
    openai: str | None = None
    stored: bool = True  # a Metric row column: in the database, events, /metrics, SSE
    csv: str | None = None
    tracker: str | None = None
    tensorboard: str | None = None
    progress: str | None = None
    checkpoint: bool = False  # in every checkpoint's metrics (full_eval ones: the final checkpoint's)
    aggregate: Aggregate = "last"


# In table order: the results CSV's columns, a point's keys and the trackers' metrics follow it.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "train_loss", "step", "nats", "loss", openai="train_loss", csv="train_loss",
        tracker="train_loss", tensorboard="train/loss", progress="train_loss", checkpoint=True,
    ),
    MetricSpec(
        "train_accuracy", "step", "fraction", "token accuracy", openai="train_mean_token_accuracy",
        csv="train_accuracy", tracker="train_accuracy", tensorboard="train/accuracy", checkpoint=True,
    ),
    MetricSpec(
        "val_loss", "eval", "nats", "loss", openai="valid_loss", csv="valid_loss", tracker="val_loss",
        tensorboard="val/loss", progress="val_loss", checkpoint=True,
    ),
    MetricSpec(
        "val_accuracy", "eval", "fraction", "token accuracy", openai="valid_mean_token_accuracy",
        csv="valid_mean_token_accuracy", tracker="val_accuracy", tensorboard="val/accuracy", checkpoint=True,
    ),
    MetricSpec(
        "lr", "step", "1", "learning rate", openai="learning_rate", csv="learning_rate",
        tracker="learning_rate", tensorboard="learning_rate",
    ),
    MetricSpec(
        "tokens_per_s", "step", "tokens/s", "throughput", openai="tokens_per_s", csv="tokens_per_s",
        tracker="tokens_per_s", tensorboard="tokens_per_s", progress="tokens_per_s",
    ),
    MetricSpec(
        "grad_norm", "step", "1", "gradient norm", openai="grad_norm", csv="grad_norm", tracker="grad_norm",
        tensorboard="grad_norm",
    ),
    MetricSpec(
        "tokens_seen", "step", "tokens", "tokens trained", openai="tokens_seen", csv="tokens_seen",
        progress="trained_tokens",
    ),
    MetricSpec(
        "peak_memory_bytes", "step", "bytes", "peak memory", openai="peak_memory_bytes", csv="peak_memory_bytes",
        tracker="peak_memory_bytes", tensorboard="memory/peak_bytes", aggregate="max",
    ),
    MetricSpec("cpu_percent", "system", "%", "process CPU", openai="cpu_percent"),
    MetricSpec("rss_bytes", "system", "bytes", "process memory (RSS)", openai="rss_bytes", aggregate="max"),
    MetricSpec("gpu_utilization", "system", "%", "device utilization", openai="gpu_utilization"),
    MetricSpec(
        "gpu_memory_bytes", "system", "bytes", "device memory reserved", openai="gpu_memory_bytes", aggregate="max"
    ),
    MetricSpec("val_ppl", "eval", "1", "perplexity", stored=False),
    MetricSpec(
        "full_valid_loss", "full_eval", "nats", "loss", openai="full_valid_loss", stored=False, checkpoint=True
    ),
    MetricSpec(
        "full_valid_mean_token_accuracy", "full_eval", "fraction", "token accuracy",
        openai="full_valid_mean_token_accuracy", stored=False, checkpoint=True,
    ),
)  # fmt: skip

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
STORED: tuple[MetricSpec, ...] = tuple(m for m in METRICS if m.stored)
OPENAI_NAMES: dict[str, str] = {m.name: m.openai for m in METRICS if m.openai}
PROGRESS_COLUMNS: dict[str, str] = {m.name: m.progress for m in METRICS if m.progress}


def of_phase(phase: Phase) -> tuple[MetricSpec, ...]:
    return tuple(m for m in METRICS if m.phase == phase)


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """A logged training step (Callbacks.on_step); see METRICS for each field."""

    step: int
    train_loss: float  # mean over the targets the step's loss covers
    train_accuracy: float | None = None  # mean next-token accuracy over those targets
    lr: float
    grad_norm: float  # before clipping
    tokens_per_s: float  # since the previous logged step, evaluation and checkpoints left out
    tokens_seen: int
    peak_memory_bytes: float | None = None  # the training process's peak so far (trainer.run.memory)


@dataclass(frozen=True, kw_only=True)
class EvalMetrics:
    """An evaluation on eval_batches validation batches (Callbacks.on_eval)."""

    step: int
    val_loss: float
    val_accuracy: float | None = None
    val_ppl: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "val_ppl", math.exp(min(self.val_loss, 700.0)))  # exp(>709) overflows


@dataclass(frozen=True, kw_only=True)
class FullEvalMetrics:
    """The final full validation pass, every validation window once (Callbacks.on_full_eval)."""

    step: int
    full_valid_loss: float
    full_valid_mean_token_accuracy: float


@dataclass(frozen=True, kw_only=True)
class SystemMetrics:
    """The machine as the worker sampled it at a metrics flush (worker.system_metrics); None: not
    measurable here (no CUDA, no NVML)."""

    step: int
    cpu_percent: float | None = None  # the process's CPU time over wall time, x100 (400: four cores)
    rss_bytes: float | None = None
    gpu_utilization: float | None = None  # percent of the time a kernel ran (NVML)
    gpu_memory_bytes: float | None = None  # reserved by this process's caching allocator


Measured = StepMetrics | EvalMetrics | FullEvalMetrics | SystemMetrics
PHASE_OF: dict[type[Measured], Phase] = {
    StepMetrics: "step",
    EvalMetrics: "eval",
    FullEvalMetrics: "full_eval",
    SystemMetrics: "system",
}


def values(measured: Measured) -> dict[str, float | None]:
    """{name: value} of the metrics `measured` holds (its step left out)."""
    return {spec.name: getattr(measured, spec.name) for spec in of_phase(PHASE_OF[type(measured)])}


def _check_registry() -> None:
    """Each phase's dataclass holds `step` and exactly the metrics of that phase; a metric that
    OpenAI's shapes carry (stored: events; checkpoint metrics) has its name there."""
    for cls, phase in PHASE_OF.items():
        declared = {f.name for f in fields(cls)} - {"step"}
        registered = {spec.name for spec in of_phase(phase)}
        if declared != registered:
            raise RuntimeError(
                f"{cls.__name__} fields {sorted(declared)} != {phase} metrics {sorted(registered)}"
            )
    unnamed = [m.name for m in METRICS if (m.stored or m.checkpoint) and not m.openai]
    if unnamed:
        raise RuntimeError(f"metrics without an OpenAI name: {unnamed}")


_check_registry()
