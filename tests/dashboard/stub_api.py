"""A stand-in for the API inside the browser (Playwright request routing), for testing the dashboard's
own code against the static files alone: each /v1 path answers from a Python function, and every
request is counted. The statuses are the real ones (core.status), as the API serves them."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from core.status import status_sets

# (query parameters, JSON body or None) -> (HTTP status, JSON answer)
Answer = Callable[[dict[str, str], Any], tuple[int, Any]]


def ok(body: Any) -> Answer:
    return lambda query, sent: (200, body)


def error(status: int, message: str, param: str | None = None) -> Answer:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return lambda query, sent: (status, body)


class StubApi:
    """Routes the page's /v1 requests to `answers[(method, path)]`; anything else is a 404."""

    def __init__(self, page: Any) -> None:
        self.calls: Counter[str] = Counter()  # "GET /fine_tuning/statuses" -> how many times
        self.sent: list[Any] = []  # the JSON bodies of POSTs, in order
        self.answers: dict[tuple[str, str], Answer] = {
            ("GET", "/fine_tuning/statuses"): ok({"object": "fine_tuning.statuses", **status_sets()}),
            ("GET", "/fine_tuning/jobs"): ok({"object": "list", "data": [], "has_more": False}),
        }
        page.route("**/v1/**", self._handle)

    def on(self, method: str, path: str, answer: Answer) -> None:
        self.answers[(method, path)] = answer

    def _handle(self, route: Any) -> None:
        request = route.request
        url = urlsplit(request.url)
        path = url.path.removeprefix("/v1")
        key = f"{request.method} {path}"
        self.calls[key] += 1
        body = json.loads(request.post_data) if request.post_data else None
        if body is not None:
            self.sent.append(body)
        answer = self.answers.get((request.method, path))
        if answer is None:
            route.fulfill(status=404, json={"error": {"message": f"no stub for {key}"}})
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        status, payload = answer(query, body)
        route.fulfill(status=status, json=payload)


def sign_in_with_stub(page: Any, static_url: str, route: str = "#/jobs") -> None:
    """Store a key as the sign-in page would, then open `route`."""
    page.goto(static_url + "/")
    page.evaluate("localStorage.setItem('fromscratch.apiKey', 'fsk-test')")
    page.goto(f"{static_url}/{route}")
