"""The trainer's commands on bad paths, changed settings, broken checkpoints and Ctrl-C: a usage
error naming the option (exit 2) or a one-line `interrupted` (exit 130), never a traceback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.trainer.conftest import SHAKESPEARE
from tests.trainer.test_cli import REPO, TINY


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run with a step checkpoint (step 2 of 3)."""
    out = tmp_path_factory.mktemp("cli") / "run"
    args = [
        "train",
        str(SHAKESPEARE),
        "--out",
        str(out),
        *TINY,
        "--max-steps",
        "3",
        "--checkpoint-every",
        "2",
    ]
    assert main([*args, "--samples", "0", "--export-formats", ""]) == 0
    return out


def usage_error(capsys: pytest.CaptureFixture, argv: list[Any]) -> str:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_bad_paths_name_their_option(tmp_path: Path, shakespeare: Path, run: Path, capsys: Any) -> None:
    train = ["train", shakespeare, *TINY, "--max-steps", "1", "--samples", "0"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "empty.txt").write_text("")
    for extra, words in [
        (["--out", tmp_path / "a", "--init-from", tmp_path / "nope"], "--init-from: "),
        (["--out", tmp_path / "b", "--init-from", afile], "is not a checkpoint folder"),
        (["--out", run, "--resume", "--init-from", run / "final"], "--init-from: a resumed run continues"),
        (["--out", afile], f"--out: {afile} is a file, not a folder"),
        (["--out", afile / "sub"], "--out: cannot write"),
        (["--out", tmp_path / "c", "--validation-file", tmp_path / "empty.txt"], "--validation-file: "),
    ]:
        assert words in usage_error(capsys, [*train, *extra]), extra


def test_a_resume_with_another_seed_names_the_option(
    tmp_path: Path, shakespeare: Path, run: Path, capsys: Any
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "final")  # the step-2 checkpoint is what --resume continues
    line = usage_error(
        capsys, ["train", shakespeare, "--out", copy, "--resume", "--seed", "99", "--samples", "0"]
    )
    assert (
        line.startswith("fromscratch train: error: --seed: a resumed run keeps the data")
        and "seed: saved 7" in line
    )


def test_continuing_a_checkpoint_refuses_architecture_and_tokenizer_options(
    tmp_path: Path, shakespeare: Path, run: Path, capsys: Any
) -> None:
    """They come from the checkpoint (as the API refuses them when continuing a model): another value
    than the checkpoint's is a usage error naming the option and the saved value, not silently dropped
    (or written into the new run's config); so is a --preset of another architecture."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "final")
    base = ["train", shakespeare, "--samples", "0", "--max-steps", "4"]
    for extra, words in [
        (["--out", tmp_path / "a", "--init-from", run / "final", "--n-embd", "64"], "--n-embd: "),
        (["--out", tmp_path / "b", "--init-from", run / "final", "--tokenizer", "bpe"], "--tokenizer: "),
        (
            ["--out", copy, "--resume", "--ctx", "64"],
            "--ctx: the checkpoint --resume continues has ctx 32, not 64",
        ),
        (["--out", copy, "--resume", "--preset", "llama-tiny"], "--preset llama-tiny: "),
    ]:
        line = usage_error(capsys, [*base, *extra])
        assert line.startswith(f"fromscratch train: error: {words}"), line
        assert "the architecture and the tokenizer come from the checkpoint" in line, line


def test_continuing_with_the_runs_own_architecture_options_is_accepted(
    tmp_path: Path, shakespeare: Path, run: Path
) -> None:
    """The command line that started a run, given again with --resume (or with --init-from), sets
    the values the checkpoint has: nothing to refuse."""
    continued = tmp_path / "continued"
    argv = ["train", shakespeare, *TINY, "--max-steps", "4", "--samples", "0", "--export-formats", ""]
    assert main([str(a) for a in [*argv, "--out", continued, "--init-from", run / "final"]]) == 0
    assert main([str(a) for a in [*argv, "--max-steps", "5", "--out", continued, "--resume"]]) == 0
    assert (continued / "final" / "state.json").is_file()


def test_a_broken_checkpoint_is_named_with_its_file(tmp_path: Path, run: Path, capsys: Any) -> None:
    truncated, missing = tmp_path / "truncated", tmp_path / "missing"
    for folder in (truncated, missing):
        shutil.copytree(run / "final", folder)
    (truncated / "model.safetensors").write_bytes((run / "final" / "model.safetensors").read_bytes()[:1000])
    (missing / "model.safetensors").unlink()
    line = usage_error(capsys, ["sample", truncated, "--max-new-tokens", "1"])
    assert "CKPT: " in line and "model.safetensors is unreadable or corrupt" in line
    line = usage_error(capsys, ["export", missing, "--format", "gguf", "--out", tmp_path / "m.gguf"])
    assert "CKPT: " in line and "model.safetensors is missing" in line


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("trainer.sample_cli.cmd_sample", interrupted)
    assert main(["sample", "x"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_a_training_run_stopped_by_ctrl_c_exits_130_saying_how_to_continue(
    tmp_path: Path, shakespeare: Path
) -> None:
    """SIGINT once a step is logged (a real condition, polled): the run stops with a checkpoint, exits
    130 (a script's `&& export` does not carry on) and says how to continue."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cli.main", "train", str(shakespeare), "--out", str(out), *TINY]
    proc = subprocess.Popen(
        [*cmd, "--max-steps", "100000", "--samples", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "the run never logged a step"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and f"--out {out} --resume" in stderr
    assert "stop at step" in stdout and list((out / "checkpoints").glob("step-*/state.json"))
