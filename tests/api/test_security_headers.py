"""Security headers on every response, the dashboard's files and the API's JSON alike (issue 25,
finding 2; the browser side is tests/dashboard/test_security_headers.py)."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from fastapi.testclient import TestClient

from api.response_headers import CSP, DOCS_CDN
from tests.api.conftest import Tenant


@pytest.mark.parametrize(
    ("path", "status"),
    [("/", 200), ("/js/app.js", 200), ("/healthz", 200), ("/v1/files", 401), ("/v1/nope", 404)],
)
def test_every_answer_carries_the_security_headers(client: TestClient, path: str, status: int) -> None:
    r = client.get(path)
    assert r.status_code == status
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"


def test_the_policy_is_strict() -> None:
    directives = dict(d.split(" ", 1) for d in CSP.split("; "))
    assert directives["default-src"] == "'self'" and directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in CSP


def test_the_api_docs_page_allows_exactly_its_own_inline_script(client: TestClient, tenant: Tenant) -> None:
    r = client.get("/docs")
    assert r.status_code == 200
    policy = r.headers["content-security-policy"]
    [script_src] = [d for d in policy.split("; ") if d.startswith("script-src ")]
    inline = re.findall(rb"<script>(.*?)</script>", r.content, re.S)
    assert inline, "FastAPI's Swagger UI page starts itself inline"
    for script in inline:
        digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
        assert f"'sha256-{digest}'" in script_src
    assert DOCS_CDN in script_src and "'unsafe-inline'" not in script_src
    assert "frame-ancestors 'none'" in policy and r.headers["x-frame-options"] == "DENY"
