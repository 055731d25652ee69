"""A job that ended before its first step has no metrics, and its charts say so (views/job/charts.js)
instead of "waiting for the first data points" forever; a job still waiting for its first step
keeps saying it waits. In a real Chromium against a stubbed API."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dashboard.stub_api import StubApi, StubJobs, job_object, ok, sign_in_with_stub

JOB_ID = "ftjob-nometrics"
EMPTY = {"object": "list", "data": [], "has_more": False}
METRIC_CHARTS = ("loss-chart", "lr-chart", "grad-norm-chart", "tps-chart")


def open_job(new_page: Any, static_url: str, status: str) -> tuple[Any, Any]:
    page, log = new_page()
    api = StubApi(page)
    job = job_object(JOB_ID, status=status)
    if status in ("failed", "cancelled"):
        job["finished_at"] = 1_700_000_030
    if status == "failed":
        job["error"] = {"code": "invalid_training_file", "message": "the file holds no text", "param": None}
    StubJobs(api).add(job, [])
    for path in ("checkpoints", "events"):
        api.on("GET", f"/fine_tuning/jobs/{JOB_ID}/{path}", ok(EMPTY))
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector("#loss-chart[data-points='0']")
    return page, log


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ("failed", "no metrics: the job failed before its first step"),
        ("cancelled", "no metrics: the job was cancelled before its first step"),
    ],
)
def test_an_ended_job_without_points_says_there_is_no_data(
    new_page: Any, static_url: str, status: str, said: str
) -> None:
    page, log = open_job(new_page, static_url, status)
    for chart in METRIC_CHARTS:
        page.wait_for_selector(f"#{chart}[data-empty='{said}']")
        assert "waiting" not in (page.get_attribute(f"#{chart}", "aria-label") or "")
    # the system charts keep their own words
    assert page.get_attribute("#cpu-chart", "data-empty") == "no system metrics recorded"
    assert log.errors() == [], log.messages


def test_a_queued_job_still_waits_for_its_first_step(new_page: Any, static_url: str) -> None:
    page, log = open_job(new_page, static_url, "queued")
    page.wait_for_selector("#live-mode:not([data-mode=loading])")
    assert page.get_attribute("#loss-chart", "data-empty") == "waiting for the first data points…"
    assert log.errors(allow=("404 (Not Found)",)) == [], log.messages
