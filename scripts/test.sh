#!/usr/bin/env bash
# Sets up a virtual environment with everything the tests need, then runs the whole suite.
# PostgreSQL and Redis URLs come from FROMSCRATCH_TEST_POSTGRES_URL / FROMSCRATCH_TEST_REDIS_URL
# (default: localhost). Where none is reachable the suite starts throwaway servers from the
# installed binaries, or stops with a message saying what to install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FROMSCRATCH_VENV:-.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
# torch first and pinned: a CPU wheel is enough for the tests.
"$VENV/bin/pip" install -q "torch==2.13.0"
# llama-cpp-python builds llama.cpp from source (a few minutes on 2 cores, cached by pip afterwards);
# portable flags so the build does not depend on this CPU's extensions.
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}" \
  "$VENV/bin/pip" install -q -e ".[test]"

# The browser tests drive Debian's Chromium through Playwright (no browser download); the
# api_load benchmark's smoke test drives wrk. Both come from Debian's packages.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's ${missing[*]} for the browser and benchmark smoke tests..."
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
      || echo "warning: could not install ${missing[*]}; the tests that need them will fail and say so" >&2
  else
    echo "warning: install Debian's ${missing[*]} package(s); the tests that need them will fail without" >&2
  fi
fi

# Lint and types first: a style or type error fails the run like a failing test.
echo "ruff check / ruff format --check / mypy ..."
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/python" -m mypy

# Two test processes (pytest-xdist), each given whole test files: each process is a test session
# with its own database and Redis index (tests/fixtures/infra.py), and a file's module fixtures stay
# in one process. On a 2-core VM (2026-11-27) the suite took 1,853 s in one process, 1,244 s in two.
# FROMSCRATCH_TEST_WORKERS=0 runs it in this process.
exec "$VENV/bin/python" -m pytest -n "${FROMSCRATCH_TEST_WORKERS:-2}" --dist loadfile "$@"
