"""Compare runs end to end in headless Chromium: a live server and a real training worker. Two tiny
jobs that differ in their learning rate are created through the API and the compare page is opened
at once, while they are queued or training: it follows them until both have ended, and then draws
exactly the API's metrics, one curve per job, says whether token accuracy was recorded as the API
does, and highlights the learning rate among the hyperparameters. The new-job form offers the
schema's train_on_inputs. Screenshot: tests/artifacts/compare.png (look at it)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.helpers import new_job_form_defaults
from tests.fixtures.service import SHAKESPEARE, LiveServer

STEPS = 16
HYPERPARAMETERS = {"batch_size": 8, "ctx": 64, "max_steps": STEPS, "eval_every": 4, "eval_batches": 2}
RATES = {"lr1": 1e-3, "lr3": 3e-3}
BOTH_ENDED_MS = 600_000  # a bound for two tiny jobs on a busy 2-core machine, not a speed check


def sign_in(page: Any, server: LiveServer) -> None:
    page.goto(server.url + "/")
    page.fill("#api-key", server.api_key)
    page.keyboard.press("Enter")
    page.wait_for_selector("h1:has-text('Training jobs')")


def create_jobs(server: LiveServer) -> list[str]:
    """Upload the text; one llama-tiny job per learning rate (suffix = its RATES key)."""
    with httpx.Client(base_url=f"{server.url}/v1", headers=server.headers(), timeout=60.0) as client:
        with open(SHAKESPEARE, "rb") as fh:
            upload = client.post(
                "/files", data={"purpose": "fine-tune"}, files={"file": (SHAKESPEARE.name, fh)}
            )
        assert upload.status_code == 200, upload.text
        ids = []
        for suffix, rate in RATES.items():
            created = client.post(
                "/fine_tuning/jobs",
                json={"model": "llama-tiny", "training_file": upload.json()["id"], "seed": 5, "suffix": suffix,
                      "hyperparameters": {**HYPERPARAMETERS, "learning_rate": rate}},
            )  # fmt: skip
            assert created.status_code == 200, created.text
            ids.append(created.json()["id"])
        return ids


def api_metrics(server: LiveServer, job_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{server.url}/v1/fine_tuning/jobs/{job_id}/metrics",
        headers=server.headers(),
        params={"max_points": 1000},
    )
    assert answer.status_code == 200, answer.text
    points: list[dict[str, Any]] = answer.json()["data"]
    return points


def test_two_live_jobs_compared(new_page: Any, live_server: LiveServer, worker_proc: Any) -> None:
    page, log = new_page()
    sign_in(page, live_server)
    # the form renders every served field: the schema's train_on_inputs is a checkbox, off by default
    assert new_job_form_defaults(page)["train_on_inputs"] is False
    assert page.get_attribute("#hp-train_on_inputs", "type") == "checkbox"

    ids = create_jobs(live_server)
    page.goto(f"{live_server.url}/#/compare?jobs={','.join(ids)}")
    page.wait_for_selector("#compare:not([data-state=loading])")
    page.wait_for_selector("#compare[data-state=done]", timeout=BOTH_ENDED_MS)
    for job_id in ids:
        job = httpx.get(
            f"{live_server.url}/v1/fine_tuning/jobs/{job_id}", headers=live_server.headers()
        ).json()
        assert job["status"] == "succeeded", job
        assert page.locator(f"#cmp-runs tr[data-job-id='{job_id}'] .badge").inner_text() == "succeeded"

    # what is drawn is what the API has: every point, one curve per job
    page.locator("#cmp-smoothing").evaluate(
        "el => { el.value = '0'; el.dispatchEvent(new Event('input', { bubbles: true })); }"
    )
    train = {r["id"]: r for r in page.evaluate("document.getElementById('cmp-train-loss').drawn")}
    val = {r["id"]: r for r in page.evaluate("document.getElementById('cmp-val-loss').drawn")}
    any_accuracy = False
    for job_id in ids:
        points = api_metrics(live_server, job_id)
        assert [p["step"] for p in points] == list(range(1, STEPS + 1))
        assert train[job_id]["xs"] == [p["step"] for p in points]
        assert train[job_id]["raw"] == pytest.approx([p["train_loss"] for p in points])
        assert train[job_id]["smoothed"] == pytest.approx(train[job_id]["raw"])  # smoothing 0
        evaluated = [p for p in points if p["val_loss"] is not None]
        assert len(evaluated) >= 3
        assert val[job_id]["xs"] == [p["step"] for p in evaluated]
        page.wait_for_selector(f"#cmp-train-loss[data-points-{job_id}='{STEPS}']")
        any_accuracy = any_accuracy or any(p.get("train_accuracy") is not None for p in points)
    assert page.get_attribute("#cmp-accuracy", "data-state") == ("charts" if any_accuracy else "empty")

    differing = page.locator("#cmp-hparams tr[data-differs=true]").evaluate_all(
        "rs => rs.map((r) => r.dataset.param)"
    )
    assert "train.learning_rate" in differing and "suffix" in differing
    assert "train.batch_size" not in differing and "model.n_embd" not in differing

    # smoothed, with the hover read-out, for the screenshot a person looks at
    page.locator("#cmp-smoothing").evaluate(
        "el => { el.value = '0.6'; el.dispatchEvent(new Event('input', { bubbles: true })); }"
    )
    box = page.locator("#cmp-train-loss").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    page.wait_for_selector("#cmp-train-loss[data-readout]")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    assert log.errors() == [], log.messages
