"""The new-job form's list kind (x-kind "list": an array of an enum, e.g. `export_formats`): one
checkbox per choice showing the default, sent only when the set differs from the default (an empty
set is sent as []), and an error about it shown next to it. Against the stubbed API."""

from __future__ import annotations

import copy
from typing import Any

from tests.dashboard.helpers import new_job_form_defaults
from tests.dashboard.stub_api import StubApi, error, ok, sign_in_with_stub
from tests.dashboard.test_newjob_form import SCHEMA

LIST_SCHEMA = copy.deepcopy(SCHEMA)
LIST_SCHEMA["properties"]["outputs"] = {
    "title": "Outputs",
    "description": "what outputs does",
    "type": "array",
    "items": {"type": "string", "enum": ["gguf", "hf", "onnx"]},
    "uniqueItems": True,
    "default": ["gguf", "hf"],
    "x-kind": "list",
    "x-section": "train",
    "x-advanced": False,
}


def open_form(page: Any, static_url: str) -> StubApi:
    api = StubApi(page)
    api.on("GET", "/fine_tuning/hyperparameters", ok(LIST_SCHEMA))
    api.on(
        "GET", "/files", ok({"object": "list", "data": [{"id": "file-1", "filename": "a.txt", "bytes": 10}]})
    )
    api.on("POST", "/fine_tuning/jobs", error(400, "outputs: names 'hf' twice", "outputs"))
    sign_in_with_stub(page, static_url)
    page.wait_for_selector("h1:has-text('Training jobs')")
    return api


def submit(page: Any, api: StubApi) -> Any:
    before = len(api.bodies("/fine_tuning/jobs"))
    page.click("button:has-text('Start training')")
    page.wait_for_function("document.getElementById('err-outputs').textContent !== ''")
    assert len(api.bodies("/fine_tuning/jobs")) == before + 1
    return api.bodies("/fine_tuning/jobs")[-1]


def test_list_field_is_a_set_of_checkboxes(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    api = open_form(page, static_url)
    defaults = new_job_form_defaults(page)
    assert defaults["outputs"] == ["gguf", "hf"]
    assert page.locator("#hp-outputs input[type=checkbox]").evaluate_all("bs => bs.map(b => b.value)") == [
        "gguf",
        "hf",
        "onnx",
    ]
    assert page.get_attribute("#hp-outputs", "aria-labelledby") == "label-outputs"
    assert page.locator("#label-outputs").inner_text() == "Outputs\noutputs"
    page.select_option("#training_file", "file-1")

    sent = submit(page, api)  # the default set: not sent
    assert "outputs" not in sent.get("hyperparameters", {}), sent
    # the error lands next to the group, which is marked and focused
    assert "twice" in page.inner_text("#err-outputs")
    assert page.get_attribute("#hp-outputs", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "hp-outputs"

    page.uncheck("#hp-outputs-gguf")
    page.check("#hp-outputs-onnx")
    assert submit(page, api)["hyperparameters"] == {"outputs": ["hf", "onnx"]}

    page.uncheck("#hp-outputs-hf")
    page.uncheck("#hp-outputs-onnx")
    assert submit(page, api)["hyperparameters"] == {"outputs": []}  # none: an empty list, sent

    page.check("#hp-outputs-hf")
    page.check("#hp-outputs-gguf")  # the default again, checked in another order: not sent
    assert "outputs" not in submit(page, api).get("hyperparameters", {})
    assert log.errors(allow=("400 (Bad Request)",)) == []
