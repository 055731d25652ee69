"""The dashboard end to end in headless Chromium against a live server with a real worker: sign in,
upload, start a llama-tiny job, watch the chart gain points, see `succeeded`, download the GGUF.
The job page's screenshot is saved as tests/artifacts/job_page.png, the new-job form's as
tests/artifacts/new_job_form.png (look at them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.helpers import new_job_form_defaults
from tests.fixtures.service import SHAKESPEARE

STEPS = 60
# Chromium logs every non-2xx response as a console error; these are the ones a test provokes.
PROVOKED = ("401 (Unauthorized)", "400 (Bad Request)")


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(url + "/")
    page.fill("#api-key", key)
    page.keyboard.press("Enter")
    page.wait_for_selector("h1:has-text('Training jobs')")


def no_horizontal_overflow(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"page is {width}px wide at {page.viewport_size['width']}px"


def test_train_watch_and_download_in_the_browser(
    new_page: Any, live_server: Any, worker_proc: Any, inference_worker: Any, tmp_path: Path
) -> None:
    page, log = new_page()
    sign_in(page, live_server.url, live_server.api_key)
    # kept in the tab only (tests/dashboard/test_security_headers.py: "Remember on this device")
    assert page.evaluate("sessionStorage.getItem('fromscratch.apiKey')") == live_server.api_key
    assert page.evaluate("localStorage.getItem('fromscratch.apiKey')") is None

    # new job: upload with a progress bar, hyperparameters with the trainer's defaults shown
    page.click("a:has-text('New job')")
    page.wait_for_selector("#hp-batch_size")
    assert page.input_value("#hp-batch_size") == "16" and page.input_value("#hp-learning_rate") == "0.001"
    assert page.input_value("#hp-n_embd") == "64"  # llama-tiny's
    page.select_option("#model", "llama-15m")
    assert page.input_value("#hp-n_embd") == "288"  # the architecture follows the preset
    page.select_option("#model", "llama-tiny")
    page.set_input_files("#upload", str(SHAKESPEARE))
    page.wait_for_selector("text=Uploaded tiny_shakespeare_100k.txt")
    assert page.get_attribute(".upload-progress .bar", "aria-valuenow") == page.get_attribute(
        ".upload-progress .bar", "aria-valuemax"
    )
    file_id = page.input_value("#training_file")
    assert file_id.startswith("file-")
    page.fill("#hp-max_steps", str(STEPS))
    page.fill("#hp-eval_every", "10")
    page.fill("#hp-checkpoint_every", "20")
    page.fill("#hp-batch_size", "8")
    # the live estimate: the server's admission arithmetic for what the form holds now
    page.wait_for_selector(
        f"#est-tokens:has-text('up to {STEPS * 8 * 128:,} ')"
    )  # x batch x llama-tiny's ctx
    assert page.inner_text("#est-steps") == f"up to {STEPS}"
    page.click("#metadata-add")
    page.fill("#metadata-key-0", "purpose")
    page.fill("#metadata-value-0", "live-test")
    page.click("button:has-text('Start training')")

    # job page: the chart gains points live; every value the canvas reports is recorded
    page.wait_for_url("**/#/jobs/ftjob-*")
    job_id = page.url.rsplit("/", 1)[-1]
    page.wait_for_selector("#loss-chart")
    page.evaluate("""() => {
        const c = document.getElementById('loss-chart');
        window.__points = [Number(c.dataset.points || 0)];
        new MutationObserver(() => window.__points.push(Number(c.dataset.points)))
            .observe(c, { attributes: true, attributeFilter: ['data-points'] });
    }""")
    page.wait_for_selector(".status-slot .badge[data-status=succeeded]", timeout=240_000)
    page.wait_for_selector(f"#loss-chart[data-points-train-loss='{STEPS}']")
    seen = page.evaluate("window.__points")
    assert seen == sorted(seen) and len(set(seen)) >= 3, f"the chart did not grow live: {seen}"

    # what the chart shows is what the API has
    metrics = httpx.get(
        f"{live_server.url}/v1/fine_tuning/jobs/{job_id}/metrics",
        headers=live_server.headers(),
        params={"limit": 1000},
    ).json()["data"]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    n_val = sum(m["val_loss"] is not None for m in metrics)
    assert n_val >= 5
    assert page.get_attribute("#loss-chart", "data-points-val-loss") == str(n_val)
    assert page.get_attribute("#lr-chart", "data-points") == str(STEPS)
    assert page.inner_text("#stat-step") == f"{STEPS} / {STEPS}"
    # the run: its file with the tokens the worker counted, its metadata, its timings
    assert "tiny_shakespeare_100k.txt" in page.inner_text("#run-training-file")
    assert "tokens" in page.inner_text("#run-training-file")
    assert page.inner_text("#run-metadata") == "purpose = live-test"
    assert page.inner_text("#run-device").startswith("cpu")
    assert page.get_attribute("#cpu-chart", "data-points-process-cpu") not in (
        None,
        "0",
    )  # sampled by the worker
    assert page.inner_text("#stat-train-loss") == f"{metrics[-1]['train_loss']:.4f}"

    # controls follow the status: a finished job can be neither paused, resumed nor cancelled
    assert (
        page.is_disabled("#btn-cancel") and page.is_disabled("#btn-pause") and page.is_disabled("#btn-resume")
    )
    # checkpoints and events
    page.wait_for_selector("#checkpoints tbody tr td.mono")
    assert page.locator("#checkpoints tbody tr").count() >= 1
    assert "succeeded" in page.inner_text("#events").lower()

    # generate from the final model
    model_id = page.inner_text("#fine-tuned-model")
    assert page.input_value("#gen-model") == model_id
    page.fill("#gen-prompt", "ROMEO:")
    page.fill("#gen-max-tokens", "40")
    page.fill("#gen-seed", "1")
    page.click("button:has-text('Generate')")
    page.wait_for_function("document.getElementById('gen-output').textContent.length > 'ROMEO:'.length")

    # download the GGUF: a real file arrives, with the GGUF magic
    assert page.input_value("#dl-model") == model_id
    with page.expect_download(timeout=120_000) as info:
        page.click("#dl-gguf")
    download = info.value
    target = tmp_path / download.suggested_filename
    download.save_as(target)
    assert download.suggested_filename.endswith(".gguf")
    assert target.read_bytes()[:4] == b"GGUF"

    # log scale, hover read-out, then the screenshot a person looks at
    page.check("#log-scale")
    box = page.locator("#loss-chart").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    # the "succeeded" note fades out (its opacity transition too) before the screenshot
    page.wait_for_function("getComputedStyle(document.getElementById('toast')).opacity === '0'")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "job_page.png"), full_page=True)

    # phone width: every page fits 390px without sideways scrolling
    page.set_viewport_size({"width": 390, "height": 844})
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    no_horizontal_overflow(page)
    page.screenshot(path=str(ARTIFACTS / "job_page_phone.png"), full_page=True)
    page.goto(live_server.url + "/#/jobs")
    page.wait_for_selector(f".job-card[data-job-id='{job_id}'] .badge[data-status=succeeded]")
    no_horizontal_overflow(page)
    page.goto(live_server.url + "/#/new")
    page.wait_for_selector("#hp-max_steps")
    no_horizontal_overflow(page)

    assert log.errors() == [], log.messages


def test_bad_key_and_field_errors_are_shown(new_page: Any, live_server: Any) -> None:
    page, log = new_page()
    page.goto(live_server.url + "/")
    page.fill("#api-key", "fsk-wrong")
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("#api-key-error:has-text('not accepted')")
    assert page.evaluate("localStorage.getItem('fromscratch.apiKey')") is None

    page.fill("#api-key", live_server.api_key)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("h1:has-text('Training jobs')")
    page.goto(live_server.url + "/#/new")
    page.set_input_files("#upload", str(SHAKESPEARE))
    page.wait_for_selector("text=Uploaded tiny_shakespeare_100k.txt")
    page.fill("#hp-n_embd", "65")  # not divisible by n_head = 4
    page.click("button:has-text('Start training')")
    error = page.locator("#err-n_embd")
    error.wait_for()
    assert "n_embd" in error.inner_text() and "divisible" in error.inner_text()
    assert page.get_attribute("#hp-n_embd", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "hp-n_embd"

    page.fill("#hp-n_embd", "64")
    page.fill("#hp-learning_rate", "-1")
    page.click("button:has-text('Start training')")
    page.wait_for_selector("#err-learning_rate:has-text('learning_rate')")
    assert page.inner_text("#err-n_embd") == ""  # the earlier error is gone
    jobs = httpx.get(f"{live_server.url}/v1/fine_tuning/jobs", headers=live_server.headers()).json()["data"]
    assert jobs == []  # nothing was created

    # a key revoked while signed in: back to the sign-in page with a message
    page.evaluate("sessionStorage.setItem('fromscratch.apiKey', 'fsk-revoked')")
    page.goto(live_server.url + "/#/jobs")
    page.wait_for_selector(".notice:has-text('401 Unauthorized')")
    assert page.is_visible("#api-key") and page.locator("#nav").is_hidden()
    assert page.evaluate("sessionStorage.getItem('fromscratch.apiKey')") is None
    assert page.evaluate("localStorage.getItem('fromscratch.apiKey')") is None
    assert log.errors(allow=PROVOKED) == [], log.messages


def test_new_job_form_shows_the_served_schema_defaults(new_page: Any, live_server: Any) -> None:
    page, log = new_page()
    sign_in(page, live_server.url, live_server.api_key)
    shown = new_job_form_defaults(page)
    schema = httpx.get(
        f"{live_server.url}/v1/fine_tuning/hyperparameters", headers=live_server.headers()
    ).json()
    properties = schema["properties"]
    assert sorted(shown) == sorted(properties)  # every field (grouped: architecture, training, advanced)
    architecture = schema["x-presets"][schema["x-default-preset"]]
    for name, prop in properties.items():
        default = architecture.get(name, prop["default"]) if prop["x-section"] == "model" else prop["default"]
        if default is None:
            assert shown[name] == prop["x-null-means"], name
        elif prop["x-kind"] in ("int", "float"):
            assert float(shown[name]) == default, name  # JS and Python spell some floats differently
        else:
            assert shown[name] == default, name
    assert page.locator("#model option").all_inner_texts() == list(schema["x-presets"])

    page.click("summary:has-text('Advanced hyperparameters')")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "new_job_form.png"), full_page=True)
    assert log.errors() == [], log.messages
