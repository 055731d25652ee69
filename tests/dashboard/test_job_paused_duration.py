"""The job page's duration is the time the job ran: the time a pause stopped it (from its status
event "paused" until it runs again, the queue after a resume included) is left out, and said. In a
real Chromium against a stubbed API."""

from __future__ import annotations

from typing import Any

from tests.dashboard.stub_api import StubApi, StubJobs, job_object, ok, sign_in_with_stub

JOB_ID = "ftjob-paused"
EMPTY = {"object": "list", "data": [], "has_more": False}
T0 = 1_700_000_000


def status_event(n: int, status: str, at: int) -> dict[str, Any]:
    """A lifecycle event as core.jobstates.transition writes it (data.status)."""
    return {"id": f"ftevent-{n}", "object": "fine_tuning.job.event", "created_at": T0 + at, "level": "info",
            "type": "message", "message": f"Job status: {status}", "data": {"status": status}}  # fmt: skip


def open_job(new_page: Any, static_url: str, job: dict[str, Any], events: list[dict[str, Any]]) -> Any:
    page, log = new_page()
    api = StubApi(page)
    StubJobs(api).add(job, [])
    base = f"/fine_tuning/jobs/{JOB_ID}"
    api.on("GET", f"{base}/checkpoints", ok(EMPTY))
    api.on("GET", f"{base}/events", ok({"object": "list", "data": events, "has_more": False}))
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector("#events li.event")
    return page, log


def test_the_duration_leaves_out_the_time_paused(new_page: Any, static_url: str) -> None:
    job = job_object(JOB_ID)  # succeeded
    job.update(started_at=T0 + 60, finished_at=T0 + 660, trained_tokens=300_000)
    events = [  # newest first, as GET /events answers
        status_event(5, "succeeded", 660),
        status_event(4, "running", 520),
        status_event(3, "queued", 500),  # resumed at 500, running again at 520: stopped 320 s
        status_event(2, "paused", 200),
        status_event(1, "running", 60),
    ]
    page, log = open_job(new_page, static_url, job, events)
    page.wait_for_selector("#run-duration:has-text('pause')")
    assert page.inner_text("#run-duration") == "4m 40s (not counting 5m 20s stopped by a pause)"
    assert page.inner_text("#run-tokens-per-s") == "1,071 average"  # over the 280 s it ran
    assert log.errors() == [], log.messages


def test_a_paused_job_s_duration_stands_still(new_page: Any, static_url: str) -> None:
    job = job_object(JOB_ID, status="paused")
    job.update(started_at=T0 + 60, finished_at=None)
    events = [status_event(2, "paused", 160), status_event(1, "running", 60)]
    page, log = open_job(new_page, static_url, job, events)
    page.wait_for_selector("#run-duration:has-text('pause')")
    assert page.inner_text("#run-duration").startswith("1m 40s (not counting ")
    assert log.errors(allow=("404 (Not Found)",)) == [], log.messages  # no stub for the live stream
