"""The new-job form (issue 24 part 5) in a real Chromium against a stubbed API: only fine-tune files
are offered for training and validation (never a job's result CSV), metadata key/value rows are
sent, the live estimate follows what the user types, and at 1280 px every label and placeholder
fits its box. Screenshot: tests/artifacts/new_job_estimate.png (look at it)."""

from __future__ import annotations

from typing import Any

from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.stub_api import ESTIMATE, StubApi, sign_in_with_stub, stub_file

FILES = [
    stub_file("file-train", "shakespeare.txt"),
    {**stub_file("file-result", "step_metrics.csv", 2000), "purpose": "fine-tune-results", "format": "csv"},
    stub_file("file-val", "val.txt", 10_000),
]


def list_files(query: dict[str, str], _: Any) -> tuple[int, Any]:
    """GET /files as the API answers it: `purpose` filters."""
    data = [f for f in FILES if query.get("purpose") in (None, f["purpose"])]
    return 200, {"object": "list", "data": data, "has_more": False}


def estimate(_: dict[str, str], body: Any) -> tuple[int, Any]:
    """The estimate of the body sent: max_steps sets the steps; n_layer 64 is too large."""
    hp = body.get("hyperparameters", {})
    steps = int(hp.get("max_steps", 1000))
    problem = None
    if hp.get("n_layer") == 64:
        problem = {"message": "The job needs about 9.0 GiB of memory, more than the largest cpu worker has",
                   "param": "n_layer"}  # fmt: skip
    return 200, {**ESTIMATE, "steps": steps, "tokens": steps * 64, "seconds": steps * 0.5, "problem": problem}


def open_form(new_page: Any, static_url: str) -> tuple[Any, Any, StubApi]:
    page, log = new_page(width=1280, height=900)
    api = StubApi(page)
    api.on("GET", "/files", list_files)
    api.on("POST", "/fine_tuning/jobs/estimate", estimate)
    api.on(
        "POST", "/fine_tuning/jobs", lambda q, b: (400, {"error": {"message": "stop here", "param": None}})
    )
    sign_in_with_stub(page, static_url, "#/new")
    page.wait_for_selector("#training_file option[value=file-train]", state="attached")
    return page, log, api


def test_only_fine_tune_files_are_offered(new_page: Any, static_url: str) -> None:
    page, log, api = open_form(new_page, static_url)
    for select in ("#training_file", "#validation_file"):
        values = page.locator(f"{select} option").evaluate_all("os => os.map((o) => o.value)")
        assert values == ["", "file-train", "file-val"], values
    assert api.calls["GET /files"] >= 1
    assert log.errors() == [], log.messages


def test_the_live_estimate_follows_the_form(new_page: Any, static_url: str) -> None:
    page, log, api = open_form(new_page, static_url)
    page.select_option("#training_file", "file-train")
    page.wait_for_selector("#est-steps:has-text('up to 1,000')")
    assert page.inner_text("#est-parameters") == "1,234"
    assert page.inner_text("#est-time") == "about 8m 20s on cpu"
    page.fill("#hp-max_steps", "300")
    page.wait_for_selector("#est-steps:has-text('up to 300')")
    assert api.bodies("/fine_tuning/jobs/estimate")[-1] == {
        "model": api.bodies("/fine_tuning/jobs/estimate")[-1]["model"],
        "training_file": "file-train",
        "hyperparameters": {"max_steps": 300},
    }
    assert page.inner_text("#est-tokens").startswith("up to 19,200")
    # a job the service would refuse: said beside the numbers, before the user submits
    page.fill("#hp-n_layer", "64")
    page.wait_for_selector("#estimate-note:has-text('Would be refused')")
    assert "more than the largest cpu worker" in page.inner_text("#estimate-note")
    page.fill("#hp-n_layer", "")
    page.wait_for_selector("#estimate-note", state="hidden")
    assert not api.bodies("/fine_tuning/jobs")  # estimating creates nothing
    assert log.errors() == [], log.messages


def test_metadata_rows_are_sent(new_page: Any, static_url: str) -> None:
    page, log, api = open_form(new_page, static_url)
    page.select_option("#training_file", "file-train")
    page.click("#metadata-add")
    page.fill("#metadata-key-0", "team")
    page.fill("#metadata-value-0", "nlp")
    page.click("#metadata-add")
    page.fill("#metadata-key-1", "sweep")
    page.fill("#metadata-value-1", "lr-3")
    page.click("#metadata-add")  # a third row left empty: not sent
    submit(page)
    assert api.bodies("/fine_tuning/jobs")[-1]["metadata"] == {"team": "nlp", "sweep": "lr-3"}
    page.click("#metadata-rows .kv-row:nth-child(2) .md-remove")
    submit(page)
    assert api.bodies("/fine_tuning/jobs")[-1]["metadata"] == {"team": "nlp"}
    assert log.errors(allow=("400 (Bad Request)",)) == [], log.messages


def submit(page: Any) -> None:
    """Start training and wait for the create's answer (the stub has recorded its body by then)."""
    is_create = lambda r: r.request.method == "POST" and r.url.endswith("/v1/fine_tuning/jobs")  # noqa: E731
    with page.expect_response(is_create):
        page.click("button:has-text('Start training')")


# Every label, placeholder and chosen option of the form, with the room it has: a label must not
# overflow its box, a placeholder or a select's text must fit inside it (measured in its font; 20 px
# for a select's arrow).
_OVERFLOWS = """() => {
    const ctx = document.createElement('canvas').getContext('2d');
    const out = [];
    for (const label of document.querySelectorAll('form.new-job label, form.new-job .label, form.new-job legend')) {
        if (label.offsetParent && label.scrollWidth > label.clientWidth + 1) out.push('label: ' + label.textContent);
    }
    for (const input of document.querySelectorAll('form.new-job input[placeholder]')) {
        if (!input.offsetParent || !input.placeholder) continue;
        const css = getComputedStyle(input);
        ctx.font = `${css.fontSize} ${css.fontFamily}`;
        const room = input.clientWidth - parseFloat(css.paddingLeft) - parseFloat(css.paddingRight);
        if (ctx.measureText(input.placeholder).width > room) out.push('placeholder: ' + input.placeholder);
    }
    for (const select of document.querySelectorAll('form.new-job select')) {
        if (!select.offsetParent || !select.selectedOptions.length) continue;
        const css = getComputedStyle(select);
        ctx.font = `${css.fontSize} ${css.fontFamily}`;
        const room = select.clientWidth - parseFloat(css.paddingLeft) - parseFloat(css.paddingRight) - 20;
        if (ctx.measureText(select.selectedOptions[0].text).width > room) out.push('select: ' + select.selectedOptions[0].text);
    }
    return out;
}"""


def test_labels_and_placeholders_fit_at_1280px(new_page: Any, static_url: str) -> None:
    page, log, _ = open_form(new_page, static_url)
    page.click("summary:has-text('Advanced hyperparameters')")
    assert page.evaluate(_OVERFLOWS) == []  # before a file is chosen: the estimate's hint
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    page.select_option("#training_file", "file-train")
    page.click("#metadata-add")
    page.wait_for_selector("#est-steps")
    assert page.evaluate(_OVERFLOWS) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "new_job_estimate.png"), full_page=True)
    assert log.errors() == [], log.messages
