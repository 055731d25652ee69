"""True statuses in the browser (issue 24 part 1): with one training worker busy with a job, a second
job waits `queued` (not `validating_files`) on the jobs list and on its own page, and goes on to
`running` there, live, once the first is cancelled. Headless Chromium, a live server, a real worker."""

from __future__ import annotations

from typing import Any

import httpx

from tests.dashboard.test_dashboard_live import sign_in
from tests.fixtures.service import SHAKESPEARE, wait_until


def create_job(client: httpx.Client, file_id: str, steps: int) -> str:
    body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": {"max_steps": steps}}
    r = client.post("/v1/fine_tuning/jobs", json=body)
    r.raise_for_status()
    return str(r.json()["id"])


def status_of(client: httpx.Client, job_id: str) -> str:
    return str(client.get(f"/v1/fine_tuning/jobs/{job_id}").json()["status"])


def test_a_job_behind_another_shows_queued_then_running(
    new_page: Any, live_server: Any, worker_proc: Any
) -> None:
    with httpx.Client(base_url=live_server.url, headers=live_server.headers(), timeout=60) as client:
        with open(SHAKESPEARE, "rb") as fh:
            up = client.post(
                "/v1/files", data={"purpose": "fine-tune"}, files={"file": ("s.txt", fh, "text/plain")}
            )
        up.raise_for_status()
        first = create_job(client, up.json()["id"], 1_000_000)
        wait_until(lambda: status_of(client, first) == "running", timeout=120, message=worker_proc.output)
        second = create_job(client, up.json()["id"], 5)
        assert status_of(client, second) == "queued"

        page, log = new_page()
        sign_in(page, live_server.url, live_server.api_key)
        card = page.locator(f"li.job-card[data-job-id='{second}']")
        card.wait_for()
        assert card.locator(".badge").get_attribute("data-status") == "queued"
        assert (
            page.locator(f"li.job-card[data-job-id='{first}'] .badge").get_attribute("data-status")
            == "running"
        )

        page.click(f"a.job-link:has-text('{second}')")
        badge = page.locator(".status-slot .badge")
        badge.wait_for()
        assert badge.get_attribute("data-status") == "queued"
        client.post(f"/v1/fine_tuning/jobs/{first}/cancel").raise_for_status()
        page.wait_for_selector(
            ".status-slot .badge[data-status='running'], .status-slot .badge[data-status='succeeded']",
            timeout=120_000,
        )
        assert not log.errors(), log.errors()
