"""`fromscratch sample|export RUN_DIR` use the run's model (RUN_DIR/final) or name the checkpoints the
folder holds; unknown options get "did you mean"; `train --help` says each default once."""

from __future__ import annotations

import re
import shutil
import sys
import types
from pathlib import Path

import pytest

from cli.main import main
from tests.trainer.test_cli import TINY


def test_sample_and_export_take_a_run_folder(tmp_path: Path, shakespeare: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    args = [
        "train",
        str(shakespeare),
        "--out",
        str(out),
        *TINY,
        "--max-steps",
        "2",
        "--checkpoint-every",
        "1",
    ]
    assert main([*args, "--samples", "0"]) == 0
    capsys.readouterr()
    assert main(["sample", str(out), "--prompt", "RO", "--max-new-tokens", "5", "--seed", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("RO") and f"using {out / 'final'}" in captured.err

    calls: list[Path] = []
    monkeypatch.setitem(
        sys.modules,
        "trainer.export",
        types.SimpleNamespace(export=lambda ckpt, *a, **k: calls.append(Path(ckpt))),
    )
    assert main(["export", str(out), "--format", "gguf", "--out", str(tmp_path / "m.gguf")]) == 0
    assert calls == [out / "final"]

    shutil.rmtree(out / "final")  # a run that has not ended as a model: its checkpoints are named
    with pytest.raises(SystemExit) as exc:
        main(["sample", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "no final/" in err and str(out / "checkpoints" / "step-00000001") in err
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path / "nothing"), "--format", "hf", "--out", str(tmp_path / "hf")])
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["train", "data.txt", "--out", "o", "--max-step", "5"], "--max-step (did you mean --max-steps?)"),
        (["sample", "o", "--tmperature", "1"], "did you mean --temperature?"),
        (
            ["jobs", "create", "--file", "f", "--lerning-rate=0.1"],
            "--lerning-rate=0.1 (did you mean --learning-rate?)",
        ),
        (["jobs", "list", "--jsn"], "did you mean --json?"),
    ],
)
def test_unknown_options_say_what_was_meant(capsys, argv: list[str], suggestion: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unrecognized option" in err and suggestion in err, err


def test_an_unknown_option_like_no_other_gets_no_guess(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["jobs", "list", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized option --zzzzzz" in err and "did you mean" not in err


@pytest.mark.parametrize("command", [["train"], ["jobs", "create"]])
def test_help_says_each_default_once(capsys, monkeypatch, command: list[str]) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    doubled = [line.strip() for line in text.splitlines() if len(re.findall(r"\(default", line)) > 1]
    assert doubled == []
    assert "--train-on-inputs" in text


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["job", "list"], "invalid choice: 'job'"),
        (["jobs", "lst"], "(did you mean list?)"),
        (["train", "data.txt", "--out", "o", "--schedule", "cosin"], "(did you mean cosine?)"),
    ],
)
def test_an_invalid_choice_says_the_closest(capsys, argv: list[str], suggestion: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and suggestion in err, err
    assert err.rstrip().endswith("?)")
