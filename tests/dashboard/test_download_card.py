"""The job page's Download card while a worker prepares an export: the server answers 202 with
Retry-After, the card says "Preparing onnx… Ns" and asks again, then the file arrives as a browser
download; an export that fails says so. The card runs alone in a real Chromium (static files), its
requests answered by Playwright routing (its buttons from the real served formats, core.exports)."""

from __future__ import annotations

import json
from typing import Any

from core.exports import served_export_formats

MODEL = "ft:llama-tiny:abc123"
MOUNT = """async (model) => {
    const { downloadCard } = await import('/js/views/job/downloads.js');
    const card = downloadCard({ signal: new AbortController().signal });
    document.body.replaceChildren(card.node);
    card.setModels([[model, 'final model']]);
}"""


def serve_content(page: Any, preparing: int, final: tuple[int, dict[str, str], bytes]) -> list[str]:
    """Answer the content URL 202 `preparing` times, then `final` (status, headers, body)."""
    calls: list[str] = []

    def handle(route: Any) -> None:
        calls.append(route.request.url)
        if len(calls) <= preparing:
            body = {
                "object": "model.export",
                "id": "export-1",
                "model": MODEL,
                "format": "onnx",
                "dtype": "f32",
                "status": "preparing",
                "message": "a worker is preparing it",
            }
            route.fulfill(
                status=202,
                headers={"Retry-After": "1"},
                content_type="application/json",
                body=json.dumps(body),
            )
            return
        status, headers, content = final
        route.fulfill(status=status, headers=headers, body=content)

    page.route("**/v1/models/**", handle)
    return calls


def open_card(page: Any, static_url: str) -> None:
    formats = {"object": "fine_tuning.export_formats", **served_export_formats()}
    page.route(
        "**/v1/fine_tuning/export_formats",
        lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(formats)),
    )
    page.goto(static_url + "/")
    page.evaluate("localStorage.setItem('fromscratch.apiKey', 'fsk-test')")
    page.evaluate(MOUNT, MODEL)
    page.wait_for_selector("#dl-onnx:not([disabled])")


def test_preparing_then_the_download(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    calls = serve_content(
        page,
        preparing=2,
        final=(
            200,
            {
                "Content-Disposition": 'attachment; filename="m.onnx"',
                "Content-Type": "application/octet-stream",
            },
            b"ONNX-bytes",
        ),
    )
    open_card(page, static_url)
    with page.expect_download(timeout=30_000) as info:
        page.click("#dl-onnx")
        page.wait_for_selector("#dl-progress[data-state=preparing]")
        assert page.inner_text("#dl-status").startswith("Preparing onnx… ")
        assert page.is_disabled("#dl-gguf")  # one download at a time
    download = info.value
    assert download.suggested_filename == "m.onnx"
    page.wait_for_selector("#dl-progress[data-state=done]")
    assert page.inner_text("#dl-status") == "Saved m.onnx (10 B)"
    assert len(calls) == 3 and all("format=onnx" in url for url in calls)
    assert not page.is_disabled("#dl-gguf")
    assert log.errors() == []


def test_a_failed_export_is_shown(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    error = {
        "error": {
            "message": "Cannot export it as onnx (f32): too odd",
            "type": "invalid_request_error",
            "param": "format",
            "code": "export_failed",
        }
    }
    serve_content(
        page, preparing=1, final=(400, {"Content-Type": "application/json"}, json.dumps(error).encode())
    )
    open_card(page, static_url)
    page.click("#dl-onnx")
    page.wait_for_selector("#dl-progress[data-state=failed]")
    assert page.inner_text("#dl-status") == "Download failed: Cannot export it as onnx (f32): too odd"
    assert log.errors(allow=("400 (Bad Request)",)) == []
