"""The new-job form's mechanics in a real Chromium against a stubbed API (static files only): fields
rendered from a served schema, the architecture following the preset, only changed fields sent,
"auto", the seed, errors next to their field, statuses and schema fetched once per sign-in. The
schema here is a small made-up one: the form must render whatever the API serves."""

from __future__ import annotations

from typing import Any

from tests.dashboard.helpers import new_job_form_defaults
from tests.dashboard.stub_api import StubApi, error, ok, sign_in_with_stub


def prop(
    title: str, kind: str, default: Any, section: str, advanced: bool = False, **more: Any
) -> dict[str, Any]:
    """One property as the API serves it; `more` adds enum, x-null-means, x-accepts-auto."""
    json_type = {"int": "integer", "float": "number", "bool": "boolean", "choice": "string"}[kind]
    nullable = default is None or "x-null-means" in more
    return {
        "title": title,
        "description": f"what {title.lower()} does",
        "type": [json_type, "null"] if nullable else json_type,
        "default": default,
        "x-kind": kind,
        "x-section": section,
        "x-advanced": advanced,
        **more,
    }


NULL_MEANS_WIDTH: dict[str, Any] = {"x-null-means": "= width"}
NULL_MEANS_STEPS: dict[str, Any] = {"x-null-means": "100 unless rounds is set"}
ACCEPTS_AUTO: dict[str, Any] = {"x-accepts-auto": True}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Hyperparameters",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "width": prop("Width", "int", 8, "model"),
        "groups": prop("Groups", "int", 2, "model", **NULL_MEANS_WIDTH),
        "steps": prop("Steps", "int", None, "train", **NULL_MEANS_STEPS),
        "batch": prop("Batch", "int", 4, "train", **ACCEPTS_AUTO),
        "rate": prop("Rate", "float", 0.01, "train"),
        "flavour": prop("Flavour", "choice", "plain", "train", enum=["plain", "spicy"]),
        "shuffle": prop("Shuffle", "bool", False, "train", advanced=True),
        "tied": prop("Tied", "bool", False, "model", advanced=True),
    },
    "x-presets": {
        "small": {"width": 8, "groups": 2, "tied": False},
        "big": {"width": 32, "groups": 32, "tied": True},
    },
    "x-default-preset": "small",
}


def open_form(page: Any, static_url: str) -> StubApi:
    """Signed in on the jobs page of a stubbed API that serves SCHEMA; one uploaded file."""
    api = StubApi(page)
    api.on("GET", "/fine_tuning/hyperparameters", ok(SCHEMA))
    api.on(
        "GET", "/files", ok({"object": "list", "data": [{"id": "file-1", "filename": "a.txt", "bytes": 10}]})
    )
    api.on("POST", "/fine_tuning/jobs", error(400, "width must be even", "width"))
    sign_in_with_stub(page, static_url)
    page.wait_for_selector("h1:has-text('Training jobs')")
    return api


def test_form_renders_the_served_schema(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    open_form(page, static_url)
    defaults = new_job_form_defaults(page)
    assert defaults == {
        "width": "8",
        "groups": "2",
        "steps": "100 unless rounds is set",
        "batch": "4",
        "rate": "0.01",
        "flavour": "plain",
        "shuffle": False,
        "tied": False,
    }
    # the label, then the name as it is sent
    assert page.locator("label[for=hp-width]").inner_text() == "Width\nwidth"
    assert page.locator("[data-field=width]").get_attribute("title") == "what width does"
    assert (
        page.locator("[data-field=steps]").get_attribute("title")
        == "what steps does\nLeft empty: 100 unless rounds is set."
    )
    assert page.locator("#hp-flavour option").all_inner_texts() == ["plain", "spicy"]
    assert page.locator("#model option").all_inner_texts() == ["small", "big"]
    # grouping: architecture, training, advanced (folded)
    assert page.locator("#hp-architecture [data-kind]").evaluate_all(
        "ns => ns.map(n => n.dataset.field)"
    ) == [
        "width",
        "groups",
    ]
    assert page.locator("#hp-training [data-kind]").count() == 4
    assert page.locator("#hp-advanced [data-kind]").count() == 2
    assert page.get_attribute("#hp-seed", "placeholder") == "random" and page.input_value("#hp-seed") == ""
    assert log.errors() == []


def test_only_changed_fields_are_sent_and_errors_land_next_to_their_field(
    new_page: Any, static_url: str
) -> None:
    page, log = new_page()
    api = open_form(page, static_url)
    page.click("#nav a[data-route=new]")
    page.wait_for_selector("#hp-width")
    page.select_option("#training_file", "file-1")

    page.click("button:has-text('Start training')")  # nothing changed: nothing but the choices sent
    page.wait_for_selector("#err-width:has-text('even')")
    assert api.bodies("/fine_tuning/jobs")[-1] == {"model": "small", "training_file": "file-1"}
    assert page.get_attribute("#hp-width", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "hp-width"

    # the architecture follows the preset, except a field the user edited
    page.fill("#hp-groups", "4")
    page.select_option("#model", "big")
    assert page.input_value("#hp-width") == "32" and page.input_value("#hp-groups") == "4"
    assert page.is_checked("#hp-tied")
    page.fill("#hp-batch", "auto")
    page.fill("#hp-rate", "1e-2")  # the default, written differently: not sent
    page.fill("#hp-steps", "50")
    page.fill("#hp-seed", "7")
    page.click("button:has-text('Start training')")
    # the submit cleared the first error; the stub's answer brings it back (after recording the body)
    page.wait_for_function("document.getElementById('err-width').textContent !== ''")
    assert api.bodies("/fine_tuning/jobs")[-1] == {
        "model": "big",
        "training_file": "file-1",
        "seed": 7,
        "hyperparameters": {"groups": 4, "steps": 50, "batch": "auto"},
    }
    assert log.errors(allow=("400 (Bad Request)",)) == []


def test_statuses_and_schema_are_fetched_once(new_page: Any, static_url: str) -> None:
    page, _ = new_page()
    api = open_form(page, static_url)
    for _ in range(2):
        page.click("#nav a[data-route=new]")
        page.wait_for_selector("#hp-width")
        page.click("#nav a[data-route=jobs]")
        page.wait_for_selector("h1:has-text('Training jobs')")
    assert api.calls["GET /fine_tuning/statuses"] == 1
    assert api.calls["GET /fine_tuning/hyperparameters"] == 1


def test_each_problem_of_one_answer_lands_under_its_own_field(new_page: Any, static_url: str) -> None:
    """One 400 can list several fields' problems (a config's: "Invalid hyperparameters: a: ...; b:
    ...", a request's types: "seed: ...; suffix: ..."), with `param` the first: each shows under its
    own field, none under another's, and a field of no form control goes to the banner."""
    page, log = new_page()
    api = open_form(page, static_url)
    page.click("#nav a[data-route=new]")
    page.wait_for_selector("#hp-width")
    page.select_option("#training_file", "file-1")

    config = (
        "Invalid hyperparameters: width: must be positive, got 0; "
        "flavour: must be one of plain, spicy; got 'x'"
    )
    api.on("POST", "/fine_tuning/jobs", error(400, config, "width"))
    page.click("button:has-text('Start training')")
    page.wait_for_selector("#err-flavour:not(:empty)")
    assert page.inner_text("#err-width") == "width: must be positive, got 0"
    assert page.inner_text("#err-flavour") == "flavour: must be one of plain, spicy; got 'x'"
    assert page.get_attribute("#hp-flavour", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "hp-width"  # the first problem's field

    types = (
        "seed: Input should be a valid integer (got 'x'); suffix: too long; method.type: bad; seed: negative"
    )
    api.on("POST", "/fine_tuning/jobs", error(400, types, "seed"))
    page.click("button:has-text('Start training')")
    page.wait_for_selector("#err-suffix:not(:empty)")
    assert page.inner_text("#err-seed") == "seed: Input should be a valid integer (got 'x'); seed: negative"
    assert page.inner_text("#err-suffix") == "suffix: too long"
    assert page.inner_text("#err-width") == "" and page.get_attribute("#hp-width", "aria-invalid") is None
    assert page.inner_text(".new-job .error-banner") == "method.type: bad"
    assert log.errors(allow=("400 (Bad Request)",)) == [], log.messages
