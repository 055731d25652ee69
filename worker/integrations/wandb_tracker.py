"""OpenAI's W&B integration: the run goes to Weights & Biases through the `wandb` package, when
this worker has it installed and configured.

Configured means `WANDB_API_KEY` in the worker's environment (online), or `WANDB_MODE=offline`
(the run is written to disk only, for `wandb sync` later) or `disabled`. Local files go under
`WANDB_DIR`, else `<work_dir>/wandb`. The run's id is the job id with `resume="allow"`, so an
attempt that resumes the job (after a pause or a crash) continues the same run; steps the new
attempt logs again are ones W&B already has and drops. Tags: the job's own, plus
`fromscratch/finetune`, `fromscratch/<model>` and `fromscratch/<job id>` (as OpenAI adds its own).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from worker.integrations.base import RunEnd, RunInfo, TrackedStep, Tracker, TrackerError

MAX_TAG_CHARS = 64  # W&B refuses longer tags
OK_EXITS = ("succeeded", "paused", "queued")  # a paused or re-queued job's run goes on later


class WandbTracker(Tracker):
    kind = "wandb"

    def __init__(self, settings: dict[str, Any]):
        self.project: str = settings["project"]
        self.name: str | None = settings.get("name")
        self.entity: str | None = settings.get("entity")
        self.tags: list[str] = list(settings.get("tags") or [])
        self.run: Any = None

    @property
    def label(self) -> str:
        return f"wandb (project {self.project!r})"

    def start(self, run: RunInfo) -> None:
        try:
            import wandb
        except ImportError as e:
            raise TrackerError("wandb is not installed on this worker") from e
        mode = os.environ.get("WANDB_MODE", "").lower()
        if not os.environ.get("WANDB_API_KEY") and mode not in ("offline", "disabled", "dryrun"):
            raise TrackerError(
                "wandb is not configured on this worker: set WANDB_API_KEY (or WANDB_MODE=offline) "
                "in the worker's environment"
            )
        folder = Path(os.environ.get("WANDB_DIR") or run.work_dir / "wandb")
        folder.mkdir(parents=True, exist_ok=True)
        tags = [*self.tags, "fromscratch/finetune", f"fromscratch/{run.model}", f"fromscratch/{run.job_id}"]
        self.run = wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.name or run.job_id,
            id=run.job_id,
            resume="allow",
            tags=list(dict.fromkeys(t[:MAX_TAG_CHARS] for t in tags)),
            config={**run.config, "hyperparameters": run.hyperparameters, "job_id": run.job_id},
            dir=str(folder),
            reinit="create_new",  # one worker process runs many jobs, each its own run
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, steps: list[TrackedStep]) -> None:
        for step, values in steps:
            self.run.log(values, step=step)

    def finish(self, end: RunEnd) -> None:
        if self.run is None:
            return
        self.run.summary.update({**end.summary, "status": end.status or "lease_lost"})
        self.run.finish(exit_code=0 if end.status in OK_EXITS else 1)
        self.run = None
