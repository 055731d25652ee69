"""Our MLflow integration, over MLflow's REST API with httpx (no `mlflow` package on the worker).

- start: the experiment by name (created when missing); the run of this job (tag
  `fromscratch.job_id`) continued when an earlier attempt made one (a resume after a pause or a
  crash), else a new run named
  `run_name` (default: the job id) with tags `fromscratch.job_id`, `fromscratch.model`, and the
  job's parameters (`job_id`, `model`, `fine_tuned_model`, `model.<field>`, `train.<field>`).
- log: `runs/log-batch`, at most 1000 metrics a request: each metric the registry gives a tracker
  name (trainer.config.metrics) when measured, one value per step. In a
  continued run, a metric's steps up to the last one the run holds are not sent again (a crashed
  attempt logged past its last checkpoint; the resumed one trains those steps again, to the same
  values, resumes being exact): MLflow would keep both values of each step, W&B drops the second.
- finish: a succeeded job's final model files (the final checkpoint folder without the optimizer
  state) uploaded as artifacts under `model/` through the server's artifact proxy
  (`/api/2.0/mlflow-artifacts/artifacts/...`, a server started with artifact serving, the
  default); tag `fromscratch.status` (and `fromscratch.fine_tuned_model`); the run's status:
  FINISHED, FAILED, KILLED (cancelled), SCHEDULED (paused or re-queued: it runs again).

The URL is the user's: the worker checks it again against its own `allowed_tracker_hosts`, does
not follow redirects, and sends the credentials of its environment (MLFLOW_TRACKING_TOKEN, or
MLFLOW_TRACKING_USERNAME + MLFLOW_TRACKING_PASSWORD) only to a host that setting lists, never to
any host when it is empty. Error reasons quote MLflow's own error code and message only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from core.tracking_uri import host_allowed, tracking_uri_problem
from worker.integrations.base import RunEnd, RunInfo, TrackedStep, Tracker, TrackerError

API = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
MAX_METRICS, MAX_PARAMS = 1000, 100  # per log-batch request (MLflow's limits)
MAX_PARAM_CHARS = 500  # the smallest limit MLflow servers have had for a parameter's value
JOB_TAG = "fromscratch.job_id"
STATUSES = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
NOT_MODEL_FILES = {"optimizer.safetensors"}  # training state, not the model
TIMEOUT = httpx.Timeout(10.0, read=60.0)
UPLOAD_TIMEOUT = httpx.Timeout(10.0, read=600.0, write=600.0)


class MlflowTracker(Tracker):
    kind = "mlflow"

    def __init__(self, settings: dict[str, Any], allowed_hosts: list[str]):
        self.tracking_uri: str = settings["tracking_uri"].rstrip("/")
        self.experiment: str = settings["experiment"]
        self.run_name: str | None = settings.get("run_name")
        self.allowed_hosts = allowed_hosts
        self.client: httpx.Client | None = None
        self.run_id = ""
        self.artifact_uri = ""
        self.logged_through: dict[str, int] = {}  # metric -> the last step earlier attempts logged

    @property
    def label(self) -> str:
        return f"mlflow ({self.tracking_uri}, experiment {self.experiment!r})"

    # ------------------------------------------------------------------ Tracker
    def start(self, run: RunInfo) -> None:
        problem = tracking_uri_problem(self.tracking_uri)
        if problem is not None:
            raise TrackerError(f"the tracking_uri {problem}")
        if not host_allowed(self.tracking_uri, self.allowed_hosts):
            raise TrackerError("this worker's allowed_tracker_hosts does not list the tracking_uri's host")
        self.client = httpx.Client(
            base_url=self.tracking_uri, timeout=TIMEOUT, follow_redirects=False, auth=self._auth()
        )
        experiment_id = self._experiment_id()
        found = (
            self._post(
                "runs/search",
                {
                    "experiment_ids": [experiment_id],
                    "filter": f"tags.`{JOB_TAG}` = '{run.job_id}'",
                    "max_results": 1,
                },
            ).get("runs")
            or []
        )
        if found:  # an earlier attempt of this job: go on with its run
            info = found[0]["info"]
            self.run_id, self.artifact_uri = info["run_id"], info.get("artifact_uri", "")
            latest = found[0].get("data", {}).get("metrics", [])  # each metric's highest step
            self.logged_through = {m["key"]: int(m.get("step", 0)) for m in latest}
            self._post("runs/update", {"run_id": self.run_id, "status": "RUNNING"})
            return
        created = self._post(
            "runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": self.run_name or run.job_id,
                "start_time": _now_ms(),
                "tags": _pairs({JOB_TAG: run.job_id, "fromscratch.model": run.model}),
            },
        )
        info = created["run"]["info"]
        self.run_id, self.artifact_uri = info["run_id"], info.get("artifact_uri", "")
        params = [{"key": k, "value": v[:MAX_PARAM_CHARS]} for k, v in run.params().items()]
        for i in range(0, len(params), MAX_PARAMS):
            self._post("runs/log-batch", {"run_id": self.run_id, "params": params[i : i + MAX_PARAMS]})

    def log(self, steps: list[TrackedStep]) -> None:
        now = _now_ms()
        metrics = [
            {"key": name, "value": value, "timestamp": now, "step": step}
            for step, values in steps
            for name, value in values.items()
            if step > self.logged_through.get(name, 0)
        ]
        for i in range(0, len(metrics), MAX_METRICS):
            self._post("runs/log-batch", {"run_id": self.run_id, "metrics": metrics[i : i + MAX_METRICS]})

    def finish(self, end: RunEnd) -> None:
        if self.client is None:
            return
        try:
            upload_error: Exception | None = None
            if end.status == "succeeded" and end.final_folder is not None:
                try:
                    self._upload_folder(end.final_folder, "model")
                except Exception as exc:  # the run's status is set all the same
                    upload_error = exc
            if end.status is not None:  # None: the lease was lost, the job's new worker goes on
                self._post(
                    "runs/log-batch",
                    {"run_id": self.run_id, "tags": _pairs({"fromscratch.status": end.status})},
                )
                update: dict[str, Any] = {
                    "run_id": self.run_id,
                    "status": STATUSES.get(end.status, "SCHEDULED"),
                }
                if end.status in STATUSES:
                    update["end_time"] = _now_ms()
                self._post("runs/update", update)
            if upload_error is not None:
                raise upload_error
        finally:
            self.client.close()
            self.client = None

    # ------------------------------------------------------------------ REST
    def _auth(self) -> httpx.Auth | None:
        """The environment's credentials, only for a host allowed_tracker_hosts lists."""
        if not self.allowed_hosts:
            return None
        token = os.environ.get("MLFLOW_TRACKING_TOKEN")
        if token:
            return _Bearer(token)
        user, password = (
            os.environ.get("MLFLOW_TRACKING_USERNAME"),
            os.environ.get("MLFLOW_TRACKING_PASSWORD"),
        )
        if user and password:
            return httpx.BasicAuth(user, password)
        return None

    def _experiment_id(self) -> str:
        for _ in range(2):  # a concurrent job may create it between our get and our create
            found = self._request(
                "GET", "experiments/get-by-name", params={"experiment_name": self.experiment}
            )
            if found is not None:
                return str(found["experiment"]["experiment_id"])
            created = self._request(
                "POST", "experiments/create", json={"name": self.experiment}, exists_ok=True
            )
            if created is not None:
                return str(created["experiment_id"])
        raise TrackerError(f"could not find or create the experiment {self.experiment!r}")

    def _post(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._request("POST", method, json=body)
        assert answer is not None
        return answer

    def _request(
        self,
        verb: str,
        method: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        exists_ok: bool = False,
    ) -> dict[str, Any] | None:
        """One REST call; None for RESOURCE_DOES_NOT_EXIST (and RESOURCE_ALREADY_EXISTS when
        `exists_ok`), TrackerError for anything else that is not a success."""
        assert self.client is not None
        try:
            response = self.client.request(verb, f"{API}/{method}", json=json, params=params)
        except httpx.HTTPError as exc:
            raise TrackerError(
                f"cannot reach the MLflow server at {self.tracking_uri}: {_short(exc)}"
            ) from exc
        if response.is_success:
            answer: dict[str, Any] = response.json()
            return answer
        code = _error_code(response)
        if code == "RESOURCE_DOES_NOT_EXIST" or (exists_ok and code == "RESOURCE_ALREADY_EXISTS"):
            return None
        raise TrackerError(_refusal(response, method))

    def _upload_folder(self, folder: Path, under: str) -> None:
        if not self.artifact_uri.startswith("mlflow-artifacts:"):
            raise TrackerError(
                f"the MLflow server does not proxy artifacts (the run's artifact location is "
                f"{self.artifact_uri!r}): start it with artifact serving to receive the model files"
            )
        root = urlsplit(self.artifact_uri).path.strip("/")  # mlflow-artifacts:/<exp>/<run>/artifacts
        assert self.client is not None
        for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name not in NOT_MODEL_FILES):
            url = f"{ARTIFACTS}/{quote(root)}/{under}/{quote(path.name)}"
            try:
                with open(path, "rb") as fh:
                    response = self.client.put(url, content=fh, timeout=UPLOAD_TIMEOUT)
            except httpx.HTTPError as exc:
                raise TrackerError(f"uploading {path.name} failed: {_short(exc)}") from exc
            if not response.is_success:
                raise TrackerError(_refusal(response, f"upload of {path.name}"))


class _Bearer(httpx.Auth):
    def __init__(self, token: str):
        self.token = token

    def auth_flow(self, request: httpx.Request) -> Any:
        request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


def _pairs(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": k, "value": v} for k, v in values.items()]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _short(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("error_code") if isinstance(body, dict) else None


def _refusal(response: httpx.Response, what: str) -> str:
    """The reason for a refused call: the status, and MLflow's error code and message (never
    another server's page: the URL is the user's)."""
    reason = f"the MLflow server answered {response.status_code} to {what}"
    try:
        body = response.json()
    except ValueError:
        return reason
    if isinstance(body, dict) and "error_code" in body:
        reason += f": {body['error_code']}: {str(body.get('message', ''))[:200]}"
    return reason
