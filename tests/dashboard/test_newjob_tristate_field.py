"""A bool hyperparameter unset by default (null: decided at run time, like compile's auto) is a
select of three states in the new-job form: unset (showing what it means), on, off; sent only
when set. Against the stubbed API."""

from __future__ import annotations

import copy
from typing import Any

from tests.dashboard.helpers import new_job_form_defaults
from tests.dashboard.stub_api import StubApi, error, ok, sign_in_with_stub
from tests.dashboard.test_newjob_form import SCHEMA

TRISTATE_SCHEMA = copy.deepcopy(SCHEMA)
TRISTATE_SCHEMA["properties"]["speedup"] = {
    "title": "Speed-up",
    "description": "what speedup does",
    "type": ["boolean", "null"],
    "default": None,
    "x-kind": "bool",
    "x-section": "train",
    "x-advanced": False,
    "x-null-means": "auto: when it pays",
}


def test_an_unset_bool_is_unset_on_or_off(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    api = StubApi(page)
    api.on("GET", "/fine_tuning/hyperparameters", ok(TRISTATE_SCHEMA))
    api.on(
        "GET", "/files", ok({"object": "list", "data": [{"id": "file-1", "filename": "a.txt", "bytes": 10}]})
    )
    api.on("POST", "/fine_tuning/jobs", error(400, "speedup: refused", "speedup"))
    sign_in_with_stub(page, static_url)
    page.wait_for_selector("h1:has-text('Training jobs')")
    assert new_job_form_defaults(page)["speedup"] == "auto: when it pays"
    assert page.locator("#hp-speedup option").evaluate_all("os => os.map(o => o.value)") == [
        "",
        "true",
        "false",
    ]
    page.select_option("#training_file", "file-1")

    def submit() -> dict[str, Any]:
        before = len(api.bodies("/fine_tuning/jobs"))
        page.click("button:has-text('Start training')")
        page.wait_for_function("document.getElementById('err-speedup').textContent !== ''")
        assert len(api.bodies("/fine_tuning/jobs")) == before + 1
        sent: dict[str, Any] = api.bodies("/fine_tuning/jobs")[-1].get("hyperparameters", {})
        page.evaluate("document.getElementById('err-speedup').textContent = ''")
        return sent

    assert "speedup" not in submit()  # unset: the run decides
    page.select_option("#hp-speedup", "false")
    assert submit() == {"speedup": False}
    page.select_option("#hp-speedup", "true")
    assert submit() == {"speedup": True}
    assert log.errors(allow=("400 (Bad Request)",)) == []
