"""Signing in keeps the address the user opened (views/signin.js), in a real Chromium against a
stubbed API: a link to a job opened signed out shows the sign-in, then that job, not the jobs list;
the sign-in page itself leads to the jobs list."""

from __future__ import annotations

from typing import Any

from tests.dashboard.stub_api import StubApi, StubJobs, job_object, ok

JOB_ID = "ftjob-deeplink"
EMPTY = {"object": "list", "data": [], "has_more": False}


def signed_out_at(new_page: Any, static_url: str, route: str) -> tuple[Any, Any]:
    page, log = new_page()
    api = StubApi(page)
    StubJobs(api).add(job_object(JOB_ID), [])
    for path in ("checkpoints", "events"):
        api.on("GET", f"/fine_tuning/jobs/{JOB_ID}/{path}", ok(EMPTY))
    page.goto(f"{static_url}/{route}")
    page.wait_for_selector("#api-key")
    return page, log


def sign_in(page: Any) -> None:
    page.fill("#api-key", "fsk-test")
    page.keyboard.press("Enter")


def test_a_deep_link_opened_signed_out_is_where_signing_in_leads(new_page: Any, static_url: str) -> None:
    page, log = signed_out_at(new_page, static_url, f"#/jobs/{JOB_ID}")
    assert page.is_visible("h1:has-text('Sign in')")
    sign_in(page)
    page.wait_for_selector(f"h1.job-title:has-text('{JOB_ID}')")
    assert page.evaluate("location.hash") == f"#/jobs/{JOB_ID}"
    assert log.errors() == [], log.messages


def test_the_sign_in_page_leads_to_the_jobs_list(new_page: Any, static_url: str) -> None:
    page, log = signed_out_at(new_page, static_url, "#/signin")
    sign_in(page)
    page.wait_for_selector("h1:has-text('Training jobs')")
    assert page.evaluate("location.hash") == "#/jobs"
    assert log.errors() == [], log.messages
