"""bench/gpu_carry.py's plan, without the network: what it carries to a GPU box comes from
pyproject (one place for the versions), never the torch the box brings, and the device call it
prints runs gpu_check with its clock inside the device tool's 10 minutes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import gpu_carry

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_it_carries_pyprojects_dependencies_but_torch_and_what_the_cuda_tests_import(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["torch==2.13.0", "fastapi>=0.115,<1", "uvicorn[standard]>=0.54"]\n'
        '[project.optional-dependencies]\ntest = ["pytest>=8", "pytest-timeout>=2.3", "openai>=1.40", '
        '"llama-cpp-python>=0.3", "triton==3.5.1; platform_system == \'Linux\'"]\n'
    )
    carried = gpu_carry.carried_requirements(pyproject)
    assert carried == ["fastapi>=0.115,<1", "uvicorn[standard]>=0.54", "pytest>=8", "pytest-timeout>=2.3",
                       "llama-cpp-python>=0.3"]  # fmt: skip
    download = gpu_carry.download_command(carried, "3.12", tmp_path)
    assert "llama-cpp-python>=0.3" not in download and "diskcache>=5.6.1" in download
    assert download[download.index("--python-version") + 1] == "3.12"
    build = gpu_carry.build_command(carried, "python3.12", tmp_path)
    assert build[0] == "python3.12" and build[-1] == "llama-cpp-python>=0.3" and "--no-deps" in build


def test_the_real_pyproject_and_the_printed_device_call() -> None:
    names = {gpu_carry.requirement_name(r) for r in gpu_carry.carried_requirements()}
    assert {"fastapi", "celery", "psycopg", "gguf", "pytest", "llama-cpp-python"} <= names
    assert not names & {"torch", "triton", "openai", "boto3"}  # the box's, a test's alone, the s3 store's
    proc = subprocess.run(
        [sys.executable, "bench/gpu_carry.py", "--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    call = proc.stdout.strip().splitlines()[-1]
    timeout, minutes = re.search(r"timeout (\d+) ", call), re.search(r"--minutes ([\d.]+) ", call)
    assert timeout is not None and minutes is not None, call
    # the check's own clock inside the timeout, and the wheels' install given half a minute
    assert float(minutes.group(1)) * 60 < int(timeout.group(1)) <= 570
    assert "bench/gpu_check.py" in call and "--target /tmp/site .whl/*.whl" in call


def test_the_wheels_of_what_the_box_brings_are_dropped_and_the_rest_weighed(tmp_path: Path) -> None:
    kept = {"fastapi-0.120.0-py3-none-any.whl": 300, "typing_extensions-4.15.0-py3-none-any.whl": 40}
    dropped = {
        "numpy-2.5.5-cp312-cp312-manylinux_2_28_x86_64.whl": 900,
        "hf_xet-1.8.0-cp38-abi3-any.whl": 500,
    }
    for name, size in {**kept, **dropped}.items():
        (tmp_path / name).write_bytes(b"x" * size)
    assert gpu_carry.drop_what_the_box_brings(tmp_path) == sum(kept.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
