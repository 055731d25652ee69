"""Pickers follow deletions made elsewhere (the CLI, another tab) without a reload, in a real
Chromium against a stubbed API: when the page is shown again (its tab visible again, its window
focused), the new-job form's file lists and the playground's model list are read again; a file or
model deleted meanwhile leaves them, and a chosen one that went is said (files) or replaced by the
newest (models)."""

from __future__ import annotations

from typing import Any

from tests.dashboard.stub_api import StubApi, ok, sign_in_with_stub, stub_file, stub_model

FILES = [stub_file("file-2", "new.txt"), stub_file("file-1", "old.txt")]
FINAL = "ft:llama-tiny:gone:final"
OTHER = "ft:llama-tiny:kept:final"


def listing(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": items, "has_more": False}


def shown_again(page: Any, how: str) -> None:
    """What the browser does when the user comes back to the page."""
    if how == "tab":
        page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
    else:
        page.evaluate("window.dispatchEvent(new Event('focus'))")


def test_the_new_job_forms_file_lists_follow_deletions(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    api = StubApi(page)
    api.on("GET", "/files", ok(listing(FILES)))
    sign_in_with_stub(page, static_url, "#/new")
    page.wait_for_selector("#training_file option[value='file-2']", state="attached")
    page.select_option("#training_file", "file-2")
    page.select_option("#validation_file", "file-1")

    api.on("GET", "/files", ok(listing(FILES[1:])))  # file-2 deleted elsewhere
    shown_again(page, "tab")
    page.wait_for_selector("#training_file option[value='file-2']", state="detached")
    assert page.locator("#validation_file option[value='file-2']").count() == 0
    assert page.input_value("#training_file") == ""
    assert "file-2 is no longer among your files" in page.inner_text("#err-training_file")
    assert page.input_value("#validation_file") == "file-1"  # still there: still chosen
    assert api.calls["GET /files"] >= 2
    assert log.errors() == [], log.messages


def test_the_playgrounds_model_list_follows_deletions(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    api = StubApi(page)
    models = [stub_model(FINAL, "ftjob-gone"), stub_model(OTHER, "ftjob-kept") | {"created": 1_700_000_000}]
    api.on("GET", "/models", ok(listing(models)))
    sign_in_with_stub(page, static_url, "#/playground?mode=completion")
    page.wait_for_selector("#pg-model:enabled")
    assert page.input_value("#pg-model") == FINAL

    api.on("GET", "/models", ok(listing(models[1:])))  # FINAL deleted elsewhere
    shown_again(page, "window")
    page.wait_for_selector(f"#pg-model option[value='{FINAL}']", state="detached")
    assert page.input_value("#pg-model") == OTHER
    assert f"model={OTHER}" in page.evaluate("decodeURIComponent(location.hash)")
    assert log.errors() == [], log.messages
