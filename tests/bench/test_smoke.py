"""Each benchmark script in bench/ runs in its seconds-long --smoke mode and prints its table, so
the scripts do not rot. The benchmarks themselves never run in the test suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# script -> the table header line it prints last (compile_policy.py's smoke run, 50 s, is gpu_check's
# compile_policy step: tests/bench/test_gpu_check.py checks its table there)
SCRIPTS = {
    "trainer_throughput.py": "config ",
    "service_overhead.py": "run ",
    "stream_latency.py": "service ",
    "api_load.py": "requests/s ",
    "transfer.py": "backend ",
    "devices.py": "run ",
    "regularization.py": "model ",
    "header_flood.py": "server ",
    "profile_step.py": "kernels by ",
    "kernel_speed.py": "kernel ",
    "cpu_threads.py": "busy ",
}


def run_smoke(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """bench/`script` --smoke, one thread, its temporary files under tmp_path, the environment's
    FROMSCRATCH_ settings left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / script), "--smoke", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_smoke_mode_prints_its_table(script: str, tmp_path: Path) -> None:
    if script == "api_load.py" and shutil.which("wrk") is None:
        # fail, never skip quietly: scripts/test.sh installs wrk when run as root
        pytest.fail("api_load needs wrk: apt-get install wrk")
    proc = run_smoke(script, tmp_path)
    assert proc.returncode == 0, f"{script} --smoke failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith(SCRIPTS[script])]
    assert header, f"{script} printed no table:\n{proc.stdout[-3000:]}"
    assert lines[header[-1] + 1].startswith("---"), proc.stdout[-3000:]
    assert len(lines) > header[-1] + 2, f"{script}'s table has no rows:\n{proc.stdout[-3000:]}"


@pytest.mark.timeout(240)
def test_profile_step_profiles_the_trainers_own_loop(tmp_path: Path) -> None:
    proc = run_smoke("profile_step.py", tmp_path, "--loop")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 steps of the trainer's loop" in proc.stdout
    step = next(line for line in proc.stdout.splitlines() if line.startswith("a step of the loop: wall "))
    wall_ms = float(step.split("wall ")[1].split(" ms")[0])
    assert wall_ms > 0
    assert "aten::mm" in proc.stdout  # the profiled steps ran the model's matmuls
    assert not list(tmp_path.glob("fs-bench-*")), "the run's folder is left behind"


def test_host_ops_counts_the_operations_and_launches_of_a_cuda_step(tmp_path: Path) -> None:
    """llama-tiny's 2 layers: 8 Triton launches a layer (each RMSNorm, the q/k/v split and SwiGLU,
    forward and backward), the final RMSNorm's 2 and the loss's 1, counted without running them."""
    proc = run_smoke("host_ops.py", tmp_path, "--time", "2", "--steps-per-round", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("ours: "))
    ops = int(line.split("ours: ")[1].split(" aten")[0].replace(",", ""))
    launches = int(line.split(", ")[-1].split(" Triton")[0])
    assert ops > 100 and launches == 8 * 2 + 3, line
    timed = next(line for line in proc.stdout.splitlines() if line.startswith("host time a step "))
    assert "(2 layers 32 wide," in timed and float(timed.split("ours ")[1].split(" ms")[0]) > 0, timed


@pytest.mark.timeout(240)
def test_trainer_throughput_gives_each_runs_rows_when_its_runs_are_done(tmp_path: Path) -> None:
    """A variant's GPU_CHECK_ROW lines follow its last run, before the next variant runs and before
    the table: gpu_check keeps them when it stops the step at its time limit."""
    proc = run_smoke("trainer_throughput.py", tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    run_done = next(i for i, line in enumerate(lines) if line.lstrip().startswith("round 1/1 "))
    rows = [i for i, line in enumerate(lines) if line.startswith("GPU_CHECK_ROW ")]
    header = next(i for i, line in enumerate(lines) if line.startswith("config "))
    assert rows and run_done < rows[0] and rows[-1] < header, proc.stdout[-3000:]
