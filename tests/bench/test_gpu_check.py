"""bench/gpu_check.py, the one command for a GPU box, checked here on the CPU so a lent GPU's
minutes are not spent finding its mistakes: it finds the CUDA test files by their marker, runs the
steps asked for, stops a step that goes silent past its limit, and says which steps failed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from bench import gpu_check  # noqa: E402
from bench._gpu_deadline import Deadline  # noqa: E402
from bench._gpu_rows import Row, emit, parse_rows, table_lines  # noqa: E402
from bench._gpu_summary import nanogpt_ratios, step_rows  # noqa: E402
from bench.nanogpt_bench import NANOGPT_PROMISED, flop_rate  # noqa: E402
from tests.fake_clock import FakeClock  # noqa: E402


def test_the_cuda_test_files_are_those_with_the_marker() -> None:
    files = gpu_check.cuda_test_files()
    assert "tests/trainer/test_cuda.py" in files and "tests/trainer/test_dropout.py" in files
    assert all("mark.cuda" in (REPO_ROOT / f).read_text() for f in files)
    assert "tests/trainer/test_loop.py" not in files


def test_a_silent_step_is_stopped_at_its_limit_and_reported() -> None:
    log = io.StringIO()
    result = gpu_check.run_step("sleepy", [sys.executable, "-c", "import time; time.sleep(60)"], 1, log)
    assert not result.passed
    assert "== sleepy: TIMED OUT after 1 s" in log.getvalue()


def smoke(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """gpu_check --smoke on this CPU (DIR `out`), the environment's FROMSCRATCH_ settings left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    return subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke", "--device", "cpu", "--out", str(out), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_smoke_runs_the_default_steps_and_checkpoints_on_a_cpu_and_writes_one_table(tmp_path: Path) -> None:
    steps = "machine,tests,kernels,throughput,profile,checkpoints,inference,service"
    proc = smoke(tmp_path, "--steps", steps)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = (
        "machine passed; tests passed; kernels passed; throughput passed; profile passed; checkpoints passed; "
        "inference passed; service passed"
    )
    assert f"== gpu_check: {passed}" in proc.stdout
    log = (tmp_path / "gpu_check.log").read_text()
    assert "tests/trainer/test_cuda.py::test_compiled_training_matches_eager_on_cuda" in log
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {name for name, step in doc["steps"].items() if step["passed"]} == set(
        passed.replace(" passed", "").split("; ")
    )
    rows = {(r["step"], r["item"]): r for r in doc["rows"]}
    assert rows[("machine", "torch")]["value"] == torch.__version__
    assert rows[("service", "job without `device`: its queue")]["value"] == "cpu"
    assert rows[("service", "inference worker's device")]["met"] is True
    assert rows[("checkpoints", "training waited for them")]["value"] >= 0
    assert any(step == "throughput" and item.endswith("tokens/s") for step, item in rows)
    assert any(step == "inference" for step, _ in rows)
    assert rows[("profile", "llama-tiny vocab 50304 eager step of the loop: wall")]["value"] > 0
    assert rows[("kernels", "Triton vs torch ops: largest relative difference")]["met"] is True
    assert rows[("tests", "pytest -m cuda")]["met"] is True  # --smoke collects them


def test_the_compile_policy_step_runs_when_named_and_its_ratios_reach_the_table(tmp_path: Path) -> None:
    proc = smoke(tmp_path, "--steps", "compile_policy")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "== gpu_check: compile_policy passed" in proc.stdout
    # compile_policy.py's own table too (this is its smoke run: tests/bench/test_smoke.py leaves it out)
    lines = proc.stdout.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith("eager min ")]
    assert header and lines[header[-1] + 1].startswith("---") and len(lines) > header[-1] + 2, proc.stdout
    [row] = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert row["item"] == "llama-tiny 0.05 min run (cpu): auto / best of eager, compile"
    assert row["value"] > 0 and row["goal"] == "<= 1.1" and row["met"] == (row["value"] <= 1.1)


def test_the_peer_step_needs_a_nanogpt_checkout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--steps", "peer", "--nanogpt", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "--nanogpt: the peer step needs a nanoGPT checkout" in proc.stderr


def test_rows_printed_by_a_step_come_back_as_they_were(capsys: object) -> None:
    emit(Row("throughput", "llama-110m bf16 eager TFLOP/s", 201.5, "TFLOP/s"))
    emit(Row("service", "inference worker's device", "cuda", goal="cuda", met=True))
    emit(Row("throughput", "no figure", float("nan")))
    printed = capsys.readouterr().out.splitlines()  # type: ignore[attr-defined]
    rows = parse_rows(["some other line", *printed, "GPU_CHECK_ROW {not json"])
    assert [r.item for r in rows] == [
        "llama-110m bf16 eager TFLOP/s",
        "inference worker's device",
        "no figure",
    ]
    assert rows[0].value == 201.5 and rows[1].met is True and rows[2].value != rows[2].value  # NaN
    lines = table_lines(rows)
    assert lines[0].split() == ["step", "item", "value", "unit", "goal", "met"]
    assert "202" in lines[1] and lines[2].rstrip().endswith("yes")


def test_pytest_and_checkpoint_lines_become_rows() -> None:
    tests = step_rows("tests", ["....s", "5 passed, 2 skipped in 31.2s"])
    assert tests[0].value == "5 passed, 2 skipped" and tests[0].met is True
    failed = step_rows("tests", ["1 failed, 4 passed in 3.0s"])
    assert failed[0].met is False
    line = (
        "4 checkpoints (4,097 MB of tensors) written in the background in 5.49 s; training waited 0.10 s "
        "for them (snapshots 0.05 s)"
    )
    rows = step_rows("checkpoints", ["step 300", line])
    assert [(r.item, r.value) for r in rows] == [
        ("4 checkpoints (4,097 MB) written in the background", 5.49),
        ("training waited for them", 0.10),
    ]


def test_nanogpt_flop_rate_and_our_ratio_to_it() -> None:
    output = "0/20 loss: 10.9\ntime per iteration: 150.0000ms, MFU: 50.00%\n"
    ms, rate = flop_rate(output) or (0.0, 0.0)
    assert ms == 150.0 and rate == 0.5 * NANOGPT_PROMISED
    assert flop_rate("Compiling model...\nTraceback") is None
    rows = [
        Row("nanogpt", "nanoGPT 124M bf16 eager TFLOP/s", 200.0),
        Row("throughput", "llama-110m bf16 eager TFLOP/s", 190.0),
        Row("nanogpt", "nanoGPT 124M bf16 compiled TFLOP/s", 300.0),
        Row("throughput", "llama-110m bf16 compiled TFLOP/s", 360.0),
    ]
    eager, compiled = nanogpt_ratios(rows)
    assert eager.value == 0.95 and eager.met is False
    assert compiled.value == 1.2 and compiled.met is True
    assert nanogpt_ratios(rows[:1]) == []
    # at nanoGPT's vocabulary: shown beside, with no goal of its own
    (same_vocab,) = nanogpt_ratios([rows[0], Row("throughput", "llama-110m-v50k bf16 eager TFLOP/s", 250.0)])
    assert same_vocab.value == 1.25 and same_vocab.goal == "" and same_vocab.met is None
    assert same_vocab.item == "llama-110m-v50k bf16 eager FLOP rate x nanoGPT's"


def test_each_step_keeps_the_later_steps_time_and_is_cut_to_what_is_left() -> None:
    clock = FakeClock()
    deadline = Deadline(9.5, clock=clock)  # 570 s, the table's 10 kept at the end
    later = ["kernels", "throughput", "nanogpt", "inference", "service"]  # 16 + 240 + 52 + 30 + 57
    assert deadline.allot("tests", 180, later) == 570 - 10 - 395
    clock.now += 250
    throughput = deadline.allot("throughput", 450, ["nanogpt", "inference", "service"])
    assert throughput == 570 - 250 - 10 - 139
    # its runs may start within the share less one run's overrun (a compiled 1.2B, ~a minute)
    assert deadline.options("throughput", throughput) == ["--budget", str(throughput - 75)]
    assert deadline.options("nanogpt", 52) == []
    clock.now += 295  # 15 s left: less than half of service's 57, the table's 10 kept
    assert deadline.allot("service", 300, []) is None


def test_without_minutes_a_step_has_its_own_limit() -> None:
    deadline = Deadline(None, clock=FakeClock())
    assert deadline.allot("throughput", 450, ["service"]) == 450
    assert deadline.options("throughput", 450) == []


def test_steps_past_the_calls_minutes_are_reported_not_run_and_the_table_is_still_written(
    tmp_path: Path,
) -> None:
    proc = smoke(tmp_path, "--steps", "machine,throughput", "--minutes", "0.01")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "== machine: NOT RUN, " in proc.stdout
    assert "== gpu_check: machine NOT RUN; throughput NOT RUN (0 s in all)" in proc.stdout
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["steps"]["throughput"] == {"passed": False, "ran": False, "seconds": 0.0}
