"""schemathesis against a live server (uvicorn, real PostgreSQL and Redis), from the OpenAPI document
the server serves, as two tenants: every operation stateless (its examples, coverage of boundary
values, then fuzzing) and a stateful phase that follows the document's links (upload -> train on it
-> read/cancel/pause the job). Bounded to FUZZ_SECONDS; asserted: no 5xx (schemathesis' check and
the server's own request metrics), every response conforms to the schema with a documented status
code and content type, and one tenant never gets the other's objects.

Not enabled: `positive_data_acceptance` — a request can fit the schema and still be refused with a
400 for what only the database knows (a training file that does not exist, an unknown cursor).
The stream is fuzzed by the stateless phases (unknown job ids: 404 at once) but not followed by the
stateful phase: the stream of a real job lasts until the job ends, and nothing trains here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.service import LiveServer

FUZZ_SECONDS = 120  # schemathesis' budget for the whole run; with the server's start, under 3 minutes
# A fixed seed by default, so a run of the suite generates the same cases and a failure replays;
# FROMSCRATCH_FUZZ_SEED=<n> explores other cases (schemathesis prints the seed it used).
DEFAULT_SEED = "20261122"
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "use_after_free",
    "ensure_resource_availability",
    "ignored_auth",
    "object_level_authorization",
)
CONFIG = """
[generation]
database = "none"

# schemathesis' list, plus 413: a body past the JSON limit (api/request_text.py) is refused unparsed,
# and 414/431: a URL or head past its bound is refused before the request is read (api/http_server.py)
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 414, 415, 422, 428, 429, 431]

# the stream of a job that is not finished lasts until it is: only ever unknown job ids here (no ids
# taken from other responses, no stateful phase), and at most one event read
[[operations]]
include-path-regex = "/stream$"
max-stream-events = 1
request-timeout = 10
phases.stateful.enabled = false
phases.examples.extra-data-sources.responses = false
phases.coverage.extra-data-sources.responses = false
phases.fuzzing.extra-data-sources.responses = false
"""


def _tenants_file(path: Path, keys: dict[str, str]) -> Path:
    """A Web Fuzzing Commons auth file: one entry per tenant, the first one schemathesis' default."""
    auth = [
        {"name": name, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {key}"}]}
        for name, key in keys.items()
    ]
    path.write_text(json.dumps({"auth": auth}))
    return path


def _server_statuses(server: LiveServer) -> Counter[str]:
    """Responses the server answered, by status, from its own request histogram (GET /metrics)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    counts: Counter[str] = Counter()
    for m in re.finditer(
        r'^fromscratch_http_request_duration_seconds_count\{.*status="(\d+)"\} (\S+)$', text, re.M
    ):
        counts[m.group(1)] += int(float(m.group(2)))
    return counts


@pytest.mark.timeout(FUZZ_SECONDS + 120)
@pytest.mark.service_settings(rate_limit="100000/second")  # the fuzzer is one busy client; see test_quotas
def test_schemathesis_finds_no_5xx_and_no_schema_violation(
    live_server: LiveServer, session_factory: Any, tmp_path: Path
) -> None:
    from core.keys import create_key

    with session_factory() as session:
        _, other_key = create_key(session, "fuzz-b", owner_id="owner-fuzz-b")
        session.commit()
    tenants = _tenants_file(
        tmp_path / "tenants.json", {"tenant-a": live_server.api_key, "tenant-b": other_key}
    )
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    har = tmp_path / "fuzz.har"
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{live_server.url}/openapi.json",
        "--auth-wfc",
        str(tenants),
        "--checks",
        ",".join(CHECKS),
        "--max-time",
        str(FUZZ_SECONDS),
        # one worker: CPython 3.11's ast.parse is not thread-safe ("AST constructor recursion depth
        # mismatch"), and hypothesis parses lambdas while it builds strategies in each worker thread
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--report",
        "har",
        "--report-har-path",
        str(har),
        "--no-color",
    ]
    cmd += ["--seed", os.environ.get("FROMSCRATCH_FUZZ_SEED") or DEFAULT_SEED]
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=FUZZ_SECONDS + 90, cwd=tmp_path)
    took = time.monotonic() - started
    # what went wrong (the report's ERRORS and FAILURES sections), then the summary
    starts = [i for i in (run.stdout.find("= ERRORS ="), run.stdout.find("= FAILURES =")) if i >= 0]
    problems = run.stdout[min(starts) :].partition("= WARNINGS =")[0] if starts else ""
    output = problems[:20000] + "\n...\n" + run.stdout[-4000:] + run.stderr[-4000:]

    entries = json.loads(har.read_text())["log"]["entries"] if har.exists() else []
    client_statuses = Counter(str(e["response"]["status"]) for e in entries)
    server_statuses = _server_statuses(live_server)
    summary = (
        f"schemathesis: {len(entries)} responses in {took:.0f}s, by status {dict(sorted(client_statuses.items()))}; "
        f"the server's metrics: {dict(sorted(server_statuses.items()))}"
    )
    print(summary)
    assert run.returncode == 0, f"{summary}\n{output}\n{live_server.process.output(tail=4000)}"
    assert "Selected: " in run.stdout and "Tested: " in run.stdout, output
    assert not [s for s in server_statuses if s.startswith("5")], summary
    assert "unhandled error" not in live_server.process.output(tail=200_000), live_server.process.output()
    assert len(entries) > 1000, summary  # it really ran
