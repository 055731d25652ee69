"""Experiment trackers through the openai SDK against a live server and a real worker: a job with
an MLflow integration (a real `mlflow server` on loopback, read back over its REST API) and a W&B
one (the worker runs with WANDB_MODE=offline: the run file is read back from its work dir); its
TensorBoard tar loads in TensorBoard's EventAccumulator; a tracker pointing at a dead server costs
the job one `warn` event, not its success."""

from __future__ import annotations

import re
import secrets
import struct
import tarfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from core.archives import extract_all
from core.blobstore import blobstore_from_settings
from core.models import Event
from tests.fixtures.mlflow_server import MlflowServer, mlflow_server  # noqa: F401 - a fixture
from tests.fixtures.service import SHAKESPEARE, LiveServer, ServiceProcess, free_port, wait_until
from tests.worker.helpers import checkpoint_rows, extract_checkpoint, metric_rows
from tests.worker.wandb_records import history, run_record
from worker.integrations.base import RunEnd, RunInfo
from worker.integrations.mlflow_tracker import MlflowTracker

pytestmark = pytest.mark.service_settings(
    lease_seconds=5.0, heartbeat_seconds=1.0, reaper_interval_seconds=1.0
)
SHORT = {
    "max_steps": 12,
    "batch_size": 4,
    "ctx": 64,
    "eval_every": 6,
    "eval_batches": 2,
    "checkpoint_every": 0,
}
# TensorBoard tag -> Metric column
TB_SCALARS = {
    "train/loss": "train_loss",
    "val/loss": "val_loss",
    "train/accuracy": "train_accuracy",
    "val/accuracy": "val_accuracy",
    "learning_rate": "lr",
    "tokens_per_s": "tokens_per_s",
    "grad_norm": "grad_norm",
}
# MLflow / W&B metric name -> Metric column
TRACKER_METRICS = {
    "train_loss": "train_loss",
    "val_loss": "val_loss",
    "train_accuracy": "train_accuracy",
    "val_accuracy": "val_accuracy",
    "learning_rate": "lr",
    "tokens_per_s": "tokens_per_s",
    "grad_norm": "grad_norm",
}


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's environment (autouse: set before worker_proc copies os.environ)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)


def sdk_of(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)


# what the worker logs when a training task has returned (Celery's trace line)
TASK_RETURNED = re.compile(r"Task fromscratch\.train_job\[[^\]]+\] succeeded in ")


def finish(sdk: openai.OpenAI, job_id: str, worker: ServiceProcess) -> Any:
    """The job once its status is final and the worker's task has returned: the trackers end their
    runs (MLflow's status, uploads, a warning) on their own thread after the job's status is written,
    and the task waits for them, so only then is everything they send there to read."""
    job = wait_until(
        lambda: (j := sdk.fine_tuning.jobs.retrieve(job_id)) and j.status in ("succeeded", "failed") and j,
        timeout=240,
        interval=0.5,
        message=lambda: f"{job_id} to finish\n{worker.output()}",
    )
    wait_until(
        lambda: task_returned(worker.output(tail=10**7), job_id),
        timeout=120,
        message=lambda: f"the worker's task for {job_id} to return\n{worker.output()}",
    )
    return job


def task_returned(output: str, job_id: str) -> bool:
    """Whether the worker's task that ran `job_id` has returned. A training worker runs one task at a
    time (pool solo), so it is the first train_job task to return after the line claiming the job;
    any return before that line is another task's, such as a message of an earlier test's job that
    the worker dropped (which once let this wait pass before the job's trackers had started)."""
    claimed = output.find(f"claimed job {job_id} ")
    return claimed >= 0 and TASK_RETURNED.search(output, claimed) is not None


def warn_events(session_factory: Any, job_id: str) -> list[Event]:
    with session_factory() as session:
        rows = session.scalars(
            select(Event).where(Event.job_id == job_id, Event.level == "warn").order_by(Event.seq)
        ).all()
        session.expunge_all()
        return list(rows)


def series(rows: list[Any], column: str) -> list[tuple[int, float]]:
    return [(m.step, getattr(m, column)) for m in rows if getattr(m, column) is not None]


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def test_mlflow_wandb_and_tensorboard_of_a_job(
    live_server: LiveServer,
    worker_proc: ServiceProcess,
    mlflow_server: MlflowServer,  # noqa: F811 - the fixture imported above
    session_factory: Any,
    tmp_path: Path,
) -> None:
    sdk = sdk_of(live_server)
    f = sdk.files.create(file=("s.txt", SHAKESPEARE.read_bytes()), purpose="fine-tune")
    experiment = f"exp-{secrets.token_hex(4)}"
    integrations: Any = [
        {"type": "wandb", "wandb": {"project": "fromscratch-tests", "name": "run-a", "tags": ["ci"]}},
        {
            "type": "mlflow",
            "mlflow": {"tracking_uri": mlflow_server.url, "experiment": experiment, "run_name": "run-a"},
        },
    ]
    created = sdk.fine_tuning.jobs.create(
        model="llama-tiny",
        training_file=f.id,
        hyperparameters=SHORT,  # type: ignore[arg-type]
        integrations=integrations,
    )
    # the SDK's types parse what the job answers: its wandb entry, and ours beside it
    assert created.integrations is not None and len(created.integrations) == 2
    assert (
        created.integrations[0].type == "wandb"
        and created.integrations[0].wandb.project == "fromscratch-tests"
    )
    assert created.integrations[0].wandb.tags == ["ci"]
    assert created.integrations[1].type == "mlflow"
    assert (created.integrations[1].model_extra or {})["mlflow"]["tracking_uri"] == mlflow_server.url

    done = finish(sdk, created.id, worker_proc)
    assert done.status == "succeeded", done.error
    assert [e.message for e in warn_events(session_factory, created.id)] == []
    rows = metric_rows(session_factory, created.id)
    assert [m.step for m in rows] == list(range(1, 13))

    # ---- MLflow: the run, its parameters, one value per logged step, the final model files
    experiment_id = mlflow_server.get("experiments/get-by-name", experiment_name=experiment)["experiment"][
        "experiment_id"
    ]
    runs = mlflow_server.post("runs/search", {"experiment_ids": [experiment_id]})["runs"]
    assert len(runs) == 1
    run = runs[0]
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "run-a"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["job_id"] == created.id and params["model"] == "llama-tiny"
    assert params["fine_tuned_model"] == done.fine_tuned_model
    assert params["train.max_steps"] == "12" and params["model.ctx"] == "64"
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["fromscratch.job_id"] == created.id and tags["fromscratch.status"] == "succeeded"
    run_id = run["info"]["run_id"]
    for name, column in TRACKER_METRICS.items():
        logged = mlflow_server.get("metrics/get-history", run_id=run_id, metric_key=name).get("metrics", [])
        got = sorted((m["step"], m["value"]) for m in logged)
        assert got == series(rows, column), name  # absent columns (no accuracy measured): no history
    assert [s for s, _ in series(rows, "val_loss")] == [6, 12]

    listed = mlflow_server.get("artifacts/list", run_id=run_id, path="model")
    names = sorted(Path(f["path"]).name for f in listed["files"])
    assert names == ["config.json", "model.safetensors", "state.json", "tokenizer.json"]
    final = next(c for c in checkpoint_rows(session_factory, created.id) if c.is_final)
    store = blobstore_from_settings(live_server.settings, session_factory)
    folder = extract_checkpoint(session_factory, store, final.blob_id, tmp_path)
    for name in names:
        uploaded = mlflow_server.artifact(run["info"]["artifact_uri"], f"model/{name}")
        assert uploaded == (folder / name).read_bytes(), name

    # ---- W&B (offline): the run file under the worker's work dir holds every step
    wandb_dir = live_server.settings.work_path / "wandb" / "wandb"
    run_files = sorted(wandb_dir.glob(f"offline-run-*-{created.id}/run-{created.id}.wandb"))
    assert len(run_files) == 1, sorted(p.name for p in wandb_dir.iterdir()) if wandb_dir.exists() else "none"
    info = run_record(run_files[0])
    assert info.project == "fromscratch-tests" and info.display_name == "run-a" and info.run_id == created.id
    assert "ci" in list(info.tags) and f"fromscratch/{created.id}" in list(info.tags)
    logged_rows = history(run_files[0])
    for name, column in TRACKER_METRICS.items():
        got = sorted((r["_step"], float(r[name])) for r in logged_rows if name in r)
        assert got == series(rows, column), name

    # ---- TensorBoard: the tar's event file, read by TensorBoard, equals the Metric rows
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    url = f"{live_server.url}/v1/fine_tuning/jobs/{created.id}/tensorboard"
    answer = httpx.get(url, headers=live_server.headers(), timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-tar"
    (tmp_path / "tb.tar").write_bytes(answer.content)
    with tarfile.open(tmp_path / "tb.tar") as tar:
        assert [n.split("/")[0] for n in tar.getnames()] == [created.id]
        extract_all(tar, tmp_path / "tb")
    accumulator = EventAccumulator(str(tmp_path / "tb" / created.id))
    accumulator.Reload()
    tags_found = set(accumulator.Tags()["scalars"])
    for tag, column in TB_SCALARS.items():
        expected = [(s, f32(v)) for s, v in series(rows, column)]
        if not expected:
            assert tag not in tags_found
            continue
        assert [(e.step, e.value) for e in accumulator.Scalars(tag)] == expected, tag

    other = httpx.get(
        f"{live_server.url}/v1/fine_tuning/jobs/ftjob-{'0' * 24}/tensorboard", headers=live_server.headers()
    )
    assert other.status_code == 404


def test_a_dead_tracking_server_is_one_warning_and_the_job_succeeds(
    live_server: LiveServer, worker_proc: ServiceProcess, session_factory: Any
) -> None:
    sdk = sdk_of(live_server)
    f = sdk.files.create(file=("s.txt", SHAKESPEARE.read_bytes()), purpose="fine-tune")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    integrations: Any = [{"type": "mlflow", "mlflow": {"tracking_uri": dead, "experiment": "nowhere"}}]
    created = sdk.fine_tuning.jobs.create(
        model="llama-tiny",
        training_file=f.id,
        hyperparameters=SHORT,
        integrations=integrations,  # type: ignore[arg-type]
    )
    done = finish(sdk, created.id, worker_proc)
    assert done.status == "succeeded", done.error
    warnings = warn_events(session_factory, created.id)
    assert len(warnings) == 1, [e.message for e in warnings]
    assert warnings[0].data["integration"] == "mlflow"
    assert dead in warnings[0].message and "cannot reach the MLflow server" in warnings[0].message
    assert [m.step for m in metric_rows(session_factory, created.id)] == list(range(1, 13))
    # the SDK reads the warning like any event
    levels = {e.message: e.level for e in sdk.fine_tuning.jobs.list_events(created.id, limit=100)}
    assert levels[warnings[0].message] == "warn"


def test_mlflow_run_continued_after_a_crash_holds_each_step_once(
    mlflow_server: MlflowServer,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """The first attempt logs steps 1-6 and dies (re-queued) with its last checkpoint at step 4;
    the second continues the same run from step 4 and logs 5-8: steps 5 and 6 are not sent again."""
    settings = {"tracking_uri": mlflow_server.url, "experiment": f"resume-{uuid.uuid4().hex[:8]}"}
    job_id = f"ftjob-{uuid.uuid4().hex[:12]}"

    def attempt(start_step: int, steps: range, loss: float, end: str) -> None:
        tracker = MlflowTracker(settings, [])
        info = RunInfo(
            job_id=job_id,
            model="llama-tiny",
            fine_tuned_model=f"ft:llama-tiny:{job_id}",
            config={"model": {}, "train": {}},
            hyperparameters={},
            start_step=start_step,
            work_dir=tmp_path,
        )
        tracker.start(info)
        tracker.log([(s, {"train_loss": loss + s}) for s in steps])
        tracker.finish(RunEnd(status=end, final_folder=None))

    attempt(0, range(1, 7), 10.0, "queued")
    attempt(4, range(5, 9), 20.0, "succeeded")

    experiment_id = mlflow_server.get("experiments/get-by-name", experiment_name=settings["experiment"])[
        "experiment"
    ]["experiment_id"]
    runs = mlflow_server.post("runs/search", {"experiment_ids": [experiment_id]})["runs"]
    assert len(runs) == 1
    logged = mlflow_server.get(
        "metrics/get-history", run_id=runs[0]["info"]["run_id"], metric_key="train_loss"
    )["metrics"]
    steps = sorted((int(m["step"]), m["value"]) for m in logged)
    # steps 5 and 6 once each, from the first attempt; 7 and 8 from the second
    assert steps == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 14.0), (5, 15.0), (6, 16.0), (7, 27.0), (8, 28.0)]
