"""Browser fixtures: Debian's Chromium (/usr/bin/chromium, `apt-get install -y chromium`) driven by
Playwright with `executable_path` (never `playwright install`), with the flags that work on these
machines, and a page helper that records console errors."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("FROMSCRATCH_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STATIC_DIR = Path(__file__).resolve().parents[2] / "api" / "static"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@dataclass
class ConsoleLog:
    """Console errors/warnings and uncaught exceptions of one page."""

    messages: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> None:
        page.on(
            "console",
            lambda m: (
                self.messages.append(f"console.{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda e: self.messages.append(f"uncaught: {e}"))

    def errors(self, allow: tuple[str, ...] = ()) -> list[str]:
        return [m for m in self.messages if not any(a in m for a in allow)]


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        # Fail, never skip: a suite that quietly drops its browser tests proves nothing.
        pytest.fail(
            f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium); "
            "scripts/test.sh does this when run as root"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def new_page(browser: Any) -> Iterator[Any]:
    """new_page(width=1280, height=900, bypass_csp=True) -> (page, ConsoleLog); contexts are closed
    at teardown. The server's Content-Security-Policy forbids eval, which Playwright's
    `wait_for_function` uses to poll its predicate in the page, so pages bypass the CSP unless a test
    asks otherwise (tests/dashboard/test_security_headers.py runs the dashboard under it)."""
    contexts: list[Any] = []

    def make(width: int = 1280, height: int = 900, bypass_csp: bool = True) -> tuple[Any, ConsoleLog]:
        context = browser.new_context(
            viewport={"width": width, "height": height}, accept_downloads=True, bypass_csp=bypass_csp
        )
        context.set_default_timeout(30_000)
        contexts.append(context)
        page = context.new_page()
        log = ConsoleLog()
        log.attach(page)
        return page, log

    yield make
    for c in contexts:
        c.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript"}

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        pass


@pytest.fixture(scope="session")
def static_url() -> Iterator[str]:
    """api/static served by a plain static file server (no API): for the page's own code."""
    handler = functools.partial(_QuietHandler, directory=str(STATIC_DIR))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
