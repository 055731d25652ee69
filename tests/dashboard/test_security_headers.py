"""The dashboard under its security headers, in Chromium against a live server (issue 25, finding 2):
it cannot be framed (a `data:` page framed `/#/jobs` before: clickjacking), it runs under the strict
Content-Security-Policy with no violation (no inline script, handler or style attribute), and the
API key stays in the tab (sessionStorage) unless "Remember on this device" is ticked."""

from __future__ import annotations

import urllib.parse
from typing import Any

from api.response_headers import CSP
from tests.fixtures.service import SHAKESPEARE

# every CSP violation of the page, as the browser reports it (init scripts are not subject to the CSP)
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__violations.push(
  `${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`));
"""
KEY = "fromscratch.apiKey"


def _violations(page: Any) -> list[str]:
    return list(page.evaluate("window.__violations"))


def _sign_in(page: Any, url: str, key: str, remember: bool = False) -> None:
    page.goto(url + "/")
    page.fill("#api-key", key)
    if remember:
        page.check("#remember-key")
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("h1:has-text('Training jobs')")


def test_the_dashboard_cannot_be_framed(new_page: Any, live_server: Any) -> None:
    page, _ = new_page(bypass_csp=False)
    frame_page = f'<iframe src="{live_server.url}/#/jobs" onload="window.__loaded = true"></iframe>'
    page.goto("data:text/html," + urllib.parse.quote(frame_page))
    page.wait_for_function("window.__loaded === true")  # the frame's load ended, refused or not
    [child] = [f for f in page.frames if f != page.main_frame]
    # refused: Chromium shows its error page in the frame, not the dashboard
    assert child.url == "chrome-error://chromewebdata/", child.url
    assert child.evaluate("document.querySelector('#main') === null")


def test_the_dashboard_runs_under_its_csp(new_page: Any, live_server: Any) -> None:
    page, log = new_page(bypass_csp=False)
    page.add_init_script(RECORD_VIOLATIONS)
    response = page.goto(live_server.url + "/")
    headers = response.headers
    assert headers["content-security-policy"] == CSP
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"

    _sign_in(page, live_server.url, live_server.api_key)
    # the key is in this tab only
    assert page.evaluate(f"sessionStorage.getItem('{KEY}')") == live_server.api_key
    assert page.evaluate(f"localStorage.getItem('{KEY}')") is None

    # every page, and the one style the page sets (through the CSSOM): the upload's progress bar
    page.click("a:has-text('New job')")
    page.wait_for_selector("#hp-batch_size")
    page.set_input_files("#upload", str(SHAKESPEARE))
    page.wait_for_selector("text=Uploaded tiny_shakespeare_100k.txt")
    assert page.eval_on_selector(".upload-progress .bar-fill", "e => e.style.width") == "100%"
    for route, ready in (
        ("compare", "#main h1"),
        ("playground", "#main h1"),
        ("jobs", "h1:has-text('Training jobs')"),
    ):
        page.click(f"a[data-route={route}]")
        page.wait_for_selector(ready)
    page.reload()  # a reload keeps the tab's key
    page.wait_for_selector("h1:has-text('Training jobs')")
    assert _violations(page) == [] and log.errors() == [], (_violations(page), log.messages)


def test_the_key_is_remembered_only_when_asked(new_page: Any, live_server: Any) -> None:
    page, _ = new_page(bypass_csp=False)
    _sign_in(page, live_server.url, live_server.api_key)
    other_tab = page.context.new_page()
    other_tab.goto(live_server.url + "/")
    other_tab.wait_for_selector("#api-key")  # a new tab is not signed in

    page, _ = new_page(bypass_csp=False)
    _sign_in(page, live_server.url, live_server.api_key, remember=True)
    assert page.evaluate(f"localStorage.getItem('{KEY}')") == live_server.api_key
    other_tab = page.context.new_page()
    other_tab.goto(live_server.url + "/")
    other_tab.wait_for_selector("h1:has-text('Training jobs')")
    other_tab.click("#sign-out")
    other_tab.wait_for_selector("#api-key")
    assert other_tab.evaluate(f"localStorage.getItem('{KEY}')") is None
