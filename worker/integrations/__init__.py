"""Experiment trackers of a job (its `integrations`): W&B (OpenAI's) and MLflow (ours).

worker.job_run starts them when the job starts running (`start_trackers`), its callbacks feed
them the metric rows they write (`TrackedCallbacks`), and it finishes them after the job's final
transition (`Trackers.finish`, with the final checkpoint folder of a succeeded job). TensorBoard
needs no integration: the API renders every job's metrics as event files
(GET /v1/fine_tuning/jobs/{id}/tensorboard).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from core.jobstates import add_event
from core.naming import final_model_id
from worker.integrations.base import RunInfo, Tracker
from worker.integrations.callbacks import TrackedCallbacks
from worker.integrations.mlflow_tracker import MlflowTracker
from worker.integrations.trackers import Trackers, Warn
from worker.integrations.wandb_tracker import WandbTracker

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from core.models import Job
    from core.settings import Settings
    from worker.job_inputs import TrainingInputs

__all__ = ["TrackedCallbacks", "Trackers", "start_trackers"]
log = logging.getLogger(__name__)


def start_trackers(
    job: Job, inputs: TrainingInputs, settings: Settings, session_factory: sessionmaker[Session]
) -> Trackers:
    """The job's trackers, started (in their own thread: this returns at once)."""
    trackers = [t for entry in job.integrations or [] if (t := _tracker(entry, settings)) is not None]
    if not trackers:
        return Trackers.none()
    started = Trackers(trackers, warn_by_event(session_factory, job.id), settings.tracker_finish_seconds)
    started.start(
        RunInfo(
            job_id=job.id,
            model=job.model,
            fine_tuned_model=final_model_id(job),
            config={"model": inputs.model_cfg.to_dict(), "train": inputs.train_cfg.to_dict()},
            hyperparameters=dict(job.hyperparameters or {}),
            start_step=inputs.resume_step if inputs.resume_path is not None else 0,
            work_dir=settings.work_path,
        )
    )
    return started


def _tracker(entry: dict[str, Any], settings: Settings) -> Tracker | None:
    kind = entry.get("type")
    try:
        if kind == "wandb":
            return WandbTracker(entry["wandb"])
        if kind == "mlflow":
            return MlflowTracker(entry["mlflow"], settings.tracker_hosts)
    except (KeyError, TypeError, AttributeError):  # the API stores only valid entries
        log.warning("ignoring a malformed %s integration: %r", kind, entry)
        return None
    log.warning("ignoring an integration of unknown type %r", kind)
    return None


def warn_by_event(session_factory: sessionmaker[Session], job_id: str) -> Warn:
    """A tracker turned off becomes one `warn` event of the job, naming it and the reason."""

    def warn(tracker: Tracker, reason: str) -> None:
        with session_factory() as session:
            add_event(
                session,
                job_id,
                f"The {tracker.label} integration was turned off for this job: {reason}",
                level="warn",
                data={"integration": tracker.kind, "reason": reason},
            )
            session.commit()

    return warn
