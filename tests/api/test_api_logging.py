"""The API's own log lines under a bare `uvicorn` (as the Dockerfile runs it): at INFO, with a
time, level and logger name, as the workers' are; a process that set up logging keeps its own.
Each case runs in a fresh interpreter: pytest configures logging in this one."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.fixtures.service import REPO_ROOT

SAY = (
    "import logging; from api.logs import install_api_logging; {setup}install_api_logging(); "
    "logging.getLogger('fromscratch.api').info('rate limit store reachable again')"
)


def _stderr(setup: str = "") -> str:
    code = SAY.format(setup=setup)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_info_lines_carry_a_time_a_level_and_the_logger() -> None:
    line = _stderr().strip()
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}: INFO\] fromscratch\.api: rate limit store reachable again",
        line,
    ), line


def test_a_process_with_its_own_logging_keeps_it() -> None:
    own = _stderr("logging.basicConfig(level=logging.INFO, format='mine %(message)s'); ")
    assert own.strip() == "mine rate limit store reachable again"
