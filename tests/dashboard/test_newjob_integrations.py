"""The new-job form's integrations (views/newjob/integrations.js) against the stubbed API: W&B and
MLflow sent as the request's top-level `integrations` list in OpenAI's shape, only the services
ticked and the fields filled in; a 400 naming `integrations[i].<type>.<field>` marks that input
(i counts the services sent, in order); nothing ticked sends no `integrations`."""

from __future__ import annotations

from typing import Any

from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.stub_api import StubApi, error
from tests.dashboard.test_newjob_form import open_form


def slot(page: Any, name: str) -> Any:
    return page.locator(f"[id='err-{name}']")


def start(page: Any, static_url: str) -> StubApi:
    api = open_form(page, static_url)
    page.click("#nav a[data-route=new]")
    page.wait_for_selector("#hp-width")
    page.select_option("#training_file", "file-1")
    return api


def submit_and_wait_for(page: Any, name: str) -> None:
    page.click("button:has-text('Start training')")
    page.wait_for_function(
        "(id) => document.getElementById(id).textContent !== ''", arg=f"err-{name}", timeout=10_000
    )


def test_integrations_are_sent_in_openais_shape_and_errors_mark_their_field(
    new_page: Any, static_url: str
) -> None:
    page, log = new_page()
    api = start(page, static_url)
    details = page.locator("details#integrations")
    assert not details.evaluate("d => d.open")  # folded away until wanted
    page.click("summary:has-text('Integrations')")
    assert page.is_disabled("#int-wandb-project")  # a service's fields wait for its tick
    page.check("#int-wandb")
    assert page.evaluate("document.activeElement.id") == "int-wandb-project"
    page.fill("#int-wandb-name", " run-7 ")
    page.fill("#int-wandb-entity", "team")
    page.fill("#int-wandb-tags", "tiny, shakespeare,, ")
    page.check("#int-mlflow")
    page.fill("#int-mlflow-tracking_uri", "http://mlflow:5000")
    page.fill("#int-mlflow-run_name", "r7")
    api.on(
        "POST",
        "/fine_tuning/jobs",
        error(
            400, "integrations[0].wandb.project: a W&B project is required", "integrations[0].wandb.project"
        ),
    )
    submit_and_wait_for(page, "integrations.wandb.project")
    assert api.bodies("/fine_tuning/jobs")[-1]["integrations"] == [
        {"type": "wandb", "wandb": {"name": "run-7", "entity": "team", "tags": ["tiny", "shakespeare"]}},
        {"type": "mlflow", "mlflow": {"tracking_uri": "http://mlflow:5000", "run_name": "r7"}},
    ]
    assert slot(page, "integrations.wandb.project").inner_text() == (
        "integrations[0].wandb.project: a W&B project is required"
    )
    assert page.get_attribute("#int-wandb-project", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "int-wandb-project"
    assert page.locator(".error-banner[role=alert]").first.is_hidden()  # at its field, not in the banner
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("form.new-job").screenshot(path=str(ARTIFACTS / "new_job_integrations.png"))

    # the second service sent: integrations[1] is MLflow's
    page.fill("#int-wandb-project", "fromscratch")
    api.on(
        "POST",
        "/fine_tuning/jobs",
        error(400, "tracking_uri must be an http(s) URL", "integrations[1].mlflow.tracking_uri"),
    )
    submit_and_wait_for(page, "integrations.mlflow.tracking_uri")
    assert api.bodies("/fine_tuning/jobs")[-1]["integrations"][0] == {
        "type": "wandb",
        "wandb": {
            "project": "fromscratch",
            "name": "run-7",
            "entity": "team",
            "tags": ["tiny", "shakespeare"],
        },
    }
    assert page.get_attribute("#int-mlflow-tracking_uri", "aria-invalid") == "true"
    assert slot(page, "integrations.wandb.project").inner_text() == ""  # the earlier error is gone
    assert page.get_attribute("#int-wandb-project", "aria-invalid") is None

    # W&B unticked: MLflow alone is integrations[0]
    page.uncheck("#int-wandb")
    api.on("POST", "/fine_tuning/jobs", error(400, "no such experiment", "integrations[0].mlflow.experiment"))
    submit_and_wait_for(page, "integrations.mlflow.experiment")
    assert api.bodies("/fine_tuning/jobs")[-1]["integrations"] == [
        {"type": "mlflow", "mlflow": {"tracking_uri": "http://mlflow:5000", "run_name": "r7"}}
    ]
    assert page.get_attribute("#int-mlflow-experiment", "aria-invalid") == "true"

    # an error about the list itself lands at the section (opened if it was folded)
    details.evaluate("d => { d.open = false; }")
    api.on(
        "POST", "/fine_tuning/jobs", error(400, "integrations: unknown type 'comet'", "integrations[0].type")
    )
    submit_and_wait_for(page, "integrations")
    assert details.evaluate("d => d.open")
    assert slot(page, "integrations").inner_text() == "integrations: unknown type 'comet'"

    # nothing ticked: no integrations at all
    page.uncheck("#int-mlflow")
    api.on("POST", "/fine_tuning/jobs", error(400, "width must be even", "width"))
    submit_and_wait_for(page, "width")
    assert "integrations" not in api.bodies("/fine_tuning/jobs")[-1]
    assert log.errors(allow=("400 (Bad Request)",)) == [], log.messages
