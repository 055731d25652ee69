"""bench/gpu_check.py, the one command for a GPU box, checked here on the CPU so a lent GPU's
minutes are not spent finding its mistakes: it finds the CUDA test files by their marker, runs the
steps asked for, stops a step that goes silent past its limit, and says which steps failed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench import gpu_check  # noqa: E402


def test_the_cuda_test_files_are_those_with_the_marker() -> None:
    files = gpu_check.cuda_test_files()
    assert "tests/trainer/test_cuda.py" in files and "tests/trainer/test_dropout.py" in files
    assert all("mark.cuda" in (REPO_ROOT / f).read_text() for f in files)
    assert "tests/trainer/test_loop.py" not in files


def test_a_silent_step_is_stopped_at_its_limit_and_reported() -> None:
    log = io.StringIO()
    ok = gpu_check.run_step("sleepy", [sys.executable, "-c", "import time; time.sleep(60)"], 1, log)
    assert not ok
    assert "== sleepy: TIMED OUT after 1 s" in log.getvalue()


def test_smoke_runs_the_machine_and_tests_steps_on_a_cpu(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke", "--device", "cpu", "--steps", "machine,tests"]
        + ["--out", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "== gpu_check: machine passed; tests passed" in proc.stdout
    log = (tmp_path / "gpu_check.log").read_text()
    assert "tests/trainer/test_cuda.py::test_compiled_training_matches_eager_on_cuda" in log


def test_the_peer_step_needs_a_nanogpt_checkout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--steps", "peer", "--nanogpt", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "--nanogpt: the peer step needs a nanoGPT checkout" in proc.stderr
