"""`fromscratch train | sample | export`: end to end in a subprocess, plus argument handling in-process."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from cli.main import main
from tests.trainer.conftest import read_metrics

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-kv-head",
    "1",
    "--n-embd",
    "32",
    "--ctx",
    "32",
    "--batch-size",
    "4",
    "--eval-batches",
    "1",
    "--seed",
    "7",
]


def fromscratch(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )


def test_train_sample_and_resume_end_to_end(tmp_path, shakespeare):
    out = tmp_path / "run"
    r = fromscratch(
        "train",
        shakespeare,
        "--out",
        out,
        *TINY,
        "--max-steps",
        "6",
        "--eval-every",
        "3",
        "--checkpoint-every",
        "3",
        "--samples",
        "1",
    )
    assert r.returncode == 0, r.stderr
    assert "completed at step 6" in r.stdout and "--- sample 1 ---" in r.stdout
    assert "step 6/6" in r.stdout  # plain progress lines when stdout is not a terminal
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics if "train_loss" in m] == [1, 2, 3, 4, 5, 6]
    assert all({"step", "train_loss", "lr", "tokens_per_s"} <= set(m) for m in metrics if "train_loss" in m)
    assert [m["step"] for m in metrics if "val_loss" in m] == [3, 6]
    assert (out / "checkpoints" / "step-00000003" / "state.json").exists()
    config = json.loads((out / "final" / "config.json").read_text())
    assert (
        config["model"]["n_embd"] == 32 and config["train"]["seed"] == 7 and config["train"]["max_steps"] == 6
    )

    # --resume keeps the run's settings (batch size, seed, ...) and takes the new --max-steps
    r = fromscratch("train", shakespeare, "--out", out, "--resume", "--max-steps", "8", "--samples", "0")
    assert r.returncode == 0, r.stderr
    assert "completed at step 8" in r.stdout
    config = json.loads((out / "final" / "config.json").read_text())
    assert (
        config["train"]["max_steps"] == 8
        and config["train"]["batch_size"] == 4
        and config["train"]["seed"] == 7
    )
    assert [m["step"] for m in read_metrics(out) if "train_loss" in m] == list(range(1, 9))

    r = fromscratch("sample", out / "final", "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ROMEO:")
    again = fromscratch(
        "sample", out / "final", "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "1"
    )
    assert again.stdout == r.stdout


def test_bad_option_exits_2_naming_it(tmp_path, shakespeare):
    r = fromscratch("train", shakespeare, "--out", tmp_path / "o", "--n-embd", "30")
    assert r.returncode == 2
    assert "--n-embd: n_embd (30) must be divisible by n_head" in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--learning-rate", "-1"], "--learning-rate: must be positive"),
        (["--batch-size", "0"], "--batch-size: must be positive"),
        (["--n-head", "3", "--n-kv-head", "2"], "--n-kv-head:"),
        (["--max-steps", "abc"], "--max-steps: invalid int value"),
        (["--schedule", "linear"], "--schedule: invalid choice"),
        (["--tokenizer", "bpe", "--vocab-size", "100"], "--vocab-size: must be >= 258, got 100"),
        (
            ["--tokenizer", "bpe", "--vocab-size", "259"],
            "--vocab-size: bpe vocab_size must be in [260, 65536]",
        ),
        (["--preset", "gpt-5"], "--preset: invalid choice"),
    ],
)
def test_bad_values_in_process(tmp_path, shakespeare, capsys, args, expected):
    with pytest.raises(SystemExit) as exc:
        main(["train", str(shakespeare), "--out", str(tmp_path / "o"), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.count("error:") == 1


def test_data_problems_exit_2(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("hello")
    with pytest.raises(SystemExit) as exc:
        main(["train", str(short), "--out", str(tmp_path / "o"), "--ctx", "32"])
    assert exc.value.code == 2
    assert "DATA:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["train", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "DATA:" in capsys.readouterr().err


def test_refuses_existing_run_without_resume(tmp_path, shakespeare, capsys):
    out = tmp_path / "o"
    assert (
        main(["train", str(shakespeare), "--out", str(out), *TINY, "--max-steps", "1", "--samples", "0"]) == 0
    )
    with pytest.raises(SystemExit) as exc:
        main(["train", str(shakespeare), "--out", str(out), *TINY, "--max-steps", "1"])
    assert exc.value.code == 2 and "--out:" in capsys.readouterr().err


def test_resume_with_nothing_to_resume_says_so_and_sample_on_a_missing_gpu_is_a_usage_error(
    tmp_path, shakespeare, capsys
):
    out = tmp_path / "new"
    args = ["train", str(shakespeare), "--out", str(out), *TINY, "--max-steps", "1", "--samples", "0"]
    assert main([*args, "--resume"]) == 0
    assert f"--resume: no checkpoint in {out} to continue from; starting a new run" in capsys.readouterr().out
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exc:
            main(["sample", str(out), "--device", "cuda", "--max-new-tokens", "1"])
        assert exc.value.code == 2 and "--device: cuda was asked for" in capsys.readouterr().err


def test_help_documents_every_contract_option_with_default(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    contract = (
        "--out --preset --n-layer --n-head --n-kv-head --n-embd --ctx --rope-dims --ffn-dim --tie-embeddings "
        "--tokenizer --vocab-size --max-steps --n-epochs --batch-size --grad-accum --optimizer "
        "--learning-rate --min-lr --warmup-steps --schedule --weight-decay --grad-clip --eval-every "
        "--eval-batches --val-fraction --validation-file --checkpoint-every --keep-checkpoints "
        "--samples-after-nl --seed --device --dtype --compile --resume --cos-decay-steps "
        "--cos-decay-restart --cos-decay-alpha --time-limit --activation-checkpointing --log-every "
        "--beta1 --beta2 --eps"
    ).split()
    for option in contract:
        assert option in text, option
    assert "(default: 16)" in text and "(default: 0.001)" in text and "(default: cosine)" in text


def test_train_options_mirror_train_config():
    import argparse

    from trainer.cli import register
    from trainer.config import TrainConfig

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    train_parser = parser._subparsers._group_actions[0].choices["train"]
    options = {s for a in train_parser._actions for s in a.option_strings}
    assert {"--" + f.replace("_", "-") for f in TrainConfig.model_fields} <= options


def test_export_calls_trainer_export(tmp_path, shakespeare, monkeypatch, capsys):
    out = tmp_path / "o"
    assert (
        main(["train", str(shakespeare), "--out", str(out), *TINY, "--max-steps", "1", "--samples", "0"]) == 0
    )
    calls = []

    def fake_export(ckpt_dir, fmt, dest, dtype="f32"):
        calls.append((Path(ckpt_dir), fmt, Path(dest), dtype))
        return Path(dest)

    monkeypatch.setitem(sys.modules, "trainer.export", types.SimpleNamespace(export=fake_export))
    assert (
        main(
            [
                "export",
                str(out / "final"),
                "--format",
                "gguf",
                "--out",
                str(tmp_path / "m.gguf"),
                "--dtype",
                "f16",
            ]
        )
        == 0
    )
    assert calls == [(out / "final", "gguf", tmp_path / "m.gguf", "f16")]
    with pytest.raises(SystemExit) as exc:
        main(["export", str(tmp_path), "--format", "hf", "--out", str(tmp_path / "hf")])
    assert exc.value.code == 2 and "CKPT:" in capsys.readouterr().err


@pytest.mark.parametrize("rich_bar", [True, False])
def test_progress_display(rich_bar):
    import io

    from trainer.config.metrics import EvalMetrics, StepMetrics
    from trainer.run.progress import ProgressCallbacks

    stream = io.StringIO()
    progress = ProgressCallbacks(stream, rich_bar=rich_bar, min_interval=0.0)
    progress.on_start(
        {
            "total_steps": 4,
            "start_step": 0,
            "n_params": 1234,
            "tokens_per_step": 128,
            "device": "cpu",
            "dtype": "float32",
            "processes": 1,
            "dtype_reason": "auto: this CPU has no native bfloat16",
            "compile": False,
            "compile_reason": "auto: the run is estimated at 3 s",
            "kernels": "fused C kernels (cpu_kernels-0123.so)",
            "auto": ["dropout 0.1: auto: 900 training tokens for 1,234 parameters"],
            "notes": ["early_stopping_patience 3 does nothing in this run: it has no validation data."],
            "train_tokens": 900,
            "val_tokens": 0,
        }
    )
    for step in range(1, 5):
        progress.on_step(
            StepMetrics(
                step=step,
                train_loss=2.5 - step * 0.1,
                lr=1e-3,
                grad_norm=0.5,
                tokens_per_s=1000.0,
                tokens_seen=step * 128,
            )
        )
    progress.on_eval(EvalMetrics(step=4, val_loss=2.0))
    progress.close()
    text = stream.getvalue()
    assert "1,234 parameters" in text and "val_loss 2.0000" in text
    assert "dtype float32: auto: this CPU has no native bfloat16" in text
    assert "torch.compile off: auto: the run is estimated at 3 s" in text
    assert "note: early_stopping_patience 3 does nothing in this run" in text
    assert "dropout 0.1: auto: 900 training tokens for 1,234 parameters" in text
    assert "4/4" in text and "2.1000" in text
    assert progress.should_stop() is None


def test_the_samples_after_training_start_from_the_first_records_prompt() -> None:
    """A chat or prompt/completion file's samples are prompted as the model was trained: the chat up
    to the assistant's header, the prompt whole (not their first line, "<|system|>" or "Q: ...")."""
    from trainer.cli import _first_prompt

    data = REPO / "tests" / "data"
    chat = _first_prompt(data / "sample_chat.jsonl")
    assert chat.startswith("<|system|>\n") and chat.endswith("\n<|assistant|>\n") and "<|user|>\n" in chat
    assert _first_prompt(data / "sample_prompt_completion.jsonl") == "Q: Tell me about water.\nA:"
    assert _first_prompt(data / "tiny_shakespeare_100k.txt") == "First Citizen:"


class _Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_sample_shows_control_characters_as_pictures_on_a_terminal(
    tty: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model's ESC, BS or CR used to reach the terminal and act on it; a pipe keeps the text."""
    from trainer import sample_cli

    out = _Terminal(tty)
    monkeypatch.setattr(sys, "stdout", out)
    sample_cli._show("a\x1b[2Jb\x08\r\n\tc\x9bd")
    assert out.getvalue() == ("a\u241b[2Jb\u2408\u240d\n\tc\ufffdd" if tty else "a\x1b[2Jb\x08\r\n\tc\x9bd")
