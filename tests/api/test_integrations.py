"""A job's `integrations` through the API (no worker): W&B (OpenAI's shape) and MLflow (ours) are
stored and answered back as given, the openai SDK's types parse them, every bad entry is a 400
naming its field with no job written, and `allowed_tracker_hosts` limits the MLflow hosts."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai._models import construct_type
from openai.types.fine_tuning import FineTuningJob

from api.main import create_app
from core.models import Job
from core.settings import Settings
from tests.api.conftest import SHAKESPEARE, Tenant, count, upload

JOBS = "/v1/fine_tuning/jobs"
WANDB = {"type": "wandb", "wandb": {"project": "proj", "name": "run-1", "entity": "team", "tags": ["a", "b"]}}
MLFLOW = {
    "type": "mlflow",
    "mlflow": {"tracking_uri": "https://mlflow.example.com:5000", "experiment": "exp"},
}


@pytest.fixture
def file_id(client: TestClient, tenant: Tenant) -> str:
    r = upload(client, tenant, SHAKESPEARE.read_bytes(), "shakespeare.txt")
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def body(file_id: str, integrations: Any) -> dict[str, Any]:
    return {
        "model": "llama-tiny",
        "training_file": file_id,
        "hyperparameters": {"max_steps": 5},
        "integrations": integrations,
    }


def test_integrations_are_stored_and_answered_as_the_sdk_reads_them(
    client: TestClient, tenant: Tenant, file_id: str, session_factory: Any
) -> None:
    r = client.post(JOBS, headers=tenant.headers, json=body(file_id, [WANDB, MLFLOW]))
    assert r.status_code == 200, r.text
    stored_mlflow = {"type": "mlflow", "mlflow": {**MLFLOW["mlflow"], "run_name": None}}  # type: ignore[dict-item]
    assert r.json()["integrations"] == [WANDB, stored_mlflow]
    with session_factory() as s:
        job = s.get(Job, r.json()["id"])
        assert job is not None and job.integrations == [WANDB, stored_mlflow]
    again = client.get(f"{JOBS}/{job.id}", headers=tenant.headers).json()
    assert again["integrations"] == [WANDB, stored_mlflow]

    sdk_job = construct_type(type_=FineTuningJob, value=again)
    assert isinstance(sdk_job, FineTuningJob) and sdk_job.integrations is not None
    assert sdk_job.integrations[0].wandb.project == "proj" and sdk_job.integrations[0].wandb.tags == [
        "a",
        "b",
    ]
    assert sdk_job.integrations[1].type == "mlflow"  # type: ignore[comparison-overlap]

    # none given (or an empty list): null, as before
    for given in (None, []):
        r = client.post(JOBS, headers=tenant.headers, json=body(file_id, given))
        assert r.status_code == 200, r.text
        assert r.json()["integrations"] is None


@pytest.mark.parametrize(
    ("integrations", "param"),
    [
        ([{"type": "wandb", "wandb": {}}], "integrations.0.wandb.project"),
        ([{"type": "wandb"}], "integrations.0.wandb"),
        ([{"type": "wandb", "wandb": {"project": ""}}], "integrations.0.wandb.project"),
        ([{"type": "wandb", "wandb": {"project": "p" * 129}}], "integrations.0.wandb.project"),
        ([{"type": "wandb", "wandb": {"project": "p", "tags": ["t" * 65]}}], "integrations.0.wandb.tags.0"),
        ([{"type": "wandb", "wandb": {"project": "p", "tags": ["t"] * 33}}], "integrations.0.wandb.tags"),
        ([{"type": "wandb", "wandb": {"project": "p", "team": "x"}}], "integrations.0.wandb.team"),
        ([{"type": "wandb", "wandb": {"project": 7}}], "integrations.0.wandb.project"),
        ([WANDB, {"type": "comet"}], "integrations.1.type"),
        ([{"type": "wandb", "wandb": {"project": "p"}, "mlflow": MLFLOW["mlflow"]}], "integrations.0.mlflow"),
        ([{"type": "mlflow", "mlflow": {"experiment": "e"}}], "integrations.0.mlflow.tracking_uri"),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://h"}}], "integrations.0.mlflow.experiment"),
        ([WANDB] * 5, "integrations"),
        ("wandb", "integrations"),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "file:///etc", "experiment": "e"}}], None),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "ftp://h/x", "experiment": "e"}}], None),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://u:pw@h:5000", "experiment": "e"}}], None),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://h:99999", "experiment": "e"}}], None),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http:///nohost", "experiment": "e"}}], None),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://h/?q=1", "experiment": "e"}}], None),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://h/ x", "experiment": "e"}}], None),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://" + "h" * 2050, "experiment": "e"}}], None),
    ],
)
def test_a_bad_integration_is_a_400_naming_its_field(
    client: TestClient,
    tenant: Tenant,
    file_id: str,
    session_factory: Any,
    integrations: Any,
    param: str | None,
) -> None:
    before = count(session_factory, Job)
    r = client.post(JOBS, headers=tenant.headers, json=body(file_id, integrations))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == (param or "integrations.0.mlflow.tracking_uri"), error
    assert error["param"] in error["message"]
    assert count(session_factory, Job) == before


def test_allowed_tracker_hosts_limits_the_mlflow_hosts(
    settings: Settings, tenant: Tenant, session_factory: Any
) -> None:
    limited = Settings(**{**settings.model_dump(), "allowed_tracker_hosts": "mlflow.internal, 10.0.0.5:5000"})
    with TestClient(create_app(limited)) as client:
        file_id = upload(client, tenant, SHAKESPEARE.read_bytes()).json()["id"]

        def uri(url: str) -> list[dict[str, Any]]:
            return [WANDB, {"type": "mlflow", "mlflow": {"tracking_uri": url, "experiment": "e"}}]

        for ok in ("http://mlflow.internal:5000", "https://MLFLOW.internal/prefix", "http://10.0.0.5:5000"):
            r = client.post(JOBS, headers=tenant.headers, json=body(file_id, uri(ok)))
            assert r.status_code == 200, (ok, r.text)
        before = count(session_factory, Job)
        for refused in ("http://169.254.169.254", "http://10.0.0.5:5001", "http://localhost:5000"):
            r = client.post(JOBS, headers=tenant.headers, json=body(file_id, uri(refused)))
            assert r.status_code == 400, (refused, r.text)
            error = r.json()["error"]
            assert error["param"] == "integrations.1.mlflow.tracking_uri"
            assert error["code"] == "tracker_host_not_allowed" and "allowed_tracker_hosts" in error["message"]
        assert count(session_factory, Job) == before
