"""The fused Triton kernels of the CUDA path (issue 23) checked against torch ops: on this CPU under
Triton's interpreter, on a GPU for real. tests/trainer/triton_cases.py holds the cases; each run
here is a process of its own because TRITON_INTERPRET must be set before Triton loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CASES = "tests/trainer/triton_cases.py"


def run_cases(interpret: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""  # the interpreter's tensors are CPU tensors
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        "--confcutdir=tests/trainer",
    ]
    return subprocess.run([*cmd, CASES], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_triton_is_installed_for_these_checks() -> None:
    from trainer.model import triton_kernels

    assert triton_kernels.triton is not None, "pip install triton (the test extra has it)"


def test_the_kernels_match_torch_ops_in_tritons_interpreter() -> None:
    proc = run_cases(interpret=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # every case ran but the two that need CUDA tensors (the model's, and the tile timing)
    assert re.search(r"\b\d+ passed, 2 skipped in ", proc.stdout), proc.stdout[-2000:]


@pytest.mark.cuda
def test_the_kernels_match_torch_ops_on_cuda() -> None:
    proc = run_cases(interpret=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # every case ran but the one that puts the model's CPU tensors on the kernels (the interpreter's)
    assert re.search(r"\b\d+ passed, 1 skipped in ", proc.stdout), proc.stdout[-2000:]


def test_a_cpu_run_never_loads_triton() -> None:
    code = (
        "import sys, torch; from trainer.config import ModelConfig; from trainer.model.llama import Llama;"
        "m = Llama(ModelConfig(n_layer=1, n_head=2, n_embd=32, ctx=16, vocab_size=50));"
        "x = torch.randint(0, 50, (2, 16)); m(x, x)[1].backward();"
        "print('triton' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]


def test_a_cuda_run_says_what_its_element_wise_ops_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from trainer.model import cpu_kernels, triton_kernels

    monkeypatch.delenv(triton_kernels.DISABLE_ENV, raising=False)
    triton_kernels.available.cache_clear()
    assert cpu_kernels.for_run("cuda", torch.bfloat16, compiled=False).startswith("Triton ")
    monkeypatch.setenv(triton_kernels.DISABLE_ENV, "0")
    triton_kernels.available.cache_clear()
    assert (
        cpu_kernels.for_run("cuda", torch.bfloat16, compiled=False)
        == "torch ops (FROMSCRATCH_TRITON_KERNELS=0)"
    )
    assert cpu_kernels.for_run("cuda", torch.bfloat16, compiled=True).startswith("torch.compile")
    monkeypatch.undo()
    triton_kernels.available.cache_clear()
