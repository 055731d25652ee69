"""`fromscratch train --export-formats`: the final model's exports in OUT/exports/ (model.gguf, hf/,
model.onnx), none with `--export-formats none`, a bad list refused naming the option, and a
format the model cannot be exported as is a warning, not a failed run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.trainer.test_cli import TINY, fromscratch


def onnx_logits_match_checkpoint(onnx_path: Path, ckpt_dir: Path) -> None:
    """The ONNX file gives the checkpoint's own logits (onnxruntime against trainer.model.llama)."""
    import onnxruntime
    import torch

    from trainer.checkpoint import load_model

    model, tokenizer = load_model(ckpt_dir)
    ids = [tokenizer.encode("To be, or not to be")]
    with torch.no_grad():
        ours, _ = model(torch.tensor(ids))
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(["logits"], {"input_ids": np.array(ids, dtype=np.int64)})
    assert np.abs(theirs - ours.numpy()).max() <= 1e-4


def test_train_writes_the_asked_exports(tmp_path: Path, shakespeare: Path) -> None:
    out = tmp_path / "run"
    r = fromscratch(
        "train",
        shakespeare,
        "--out",
        out,
        *TINY,
        "--max-steps",
        "3",
        "--eval-every",
        "0",
        "--samples",
        "0",
        "--export-formats",
        "onnx,gguf",
    )
    assert r.returncode == 0, r.stderr
    exports = out / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["model.gguf", "model.onnx"]
    assert f"export onnx: {exports / 'model.onnx'}" in r.stdout
    assert (exports / "model.gguf").read_bytes()[:4] == b"GGUF"
    onnx_logits_match_checkpoint(exports / "model.onnx", out / "final")


def test_default_exports_none_and_a_format_that_cannot_be_made(tmp_path: Path, shakespeare: Path) -> None:
    common = [*TINY, "--max-steps", "2", "--eval-every", "0", "--samples", "0"]
    r = fromscratch("train", shakespeare, "--out", tmp_path / "default", *common)
    assert r.returncode == 0, r.stderr
    exports = tmp_path / "default" / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["hf", "model.gguf"]  # the default: gguf,hf
    assert json.loads((exports / "hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in (exports / "hf").iterdir()}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as the rest (the umask's)

    r = fromscratch("train", shakespeare, "--out", tmp_path / "none", *common, "--export-formats", "none")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "none" / "exports").exists()

    # partial RoPE: Hugging Face's Llama cannot express it; the run still succeeds with its gguf
    r = fromscratch(
        "train",
        shakespeare,
        "--out",
        tmp_path / "partial",
        *common,
        "--rope-dims",
        "8",
        "--export-formats",
        "hf,gguf",
    )
    assert r.returncode == 0, r.stderr
    assert "warning: no hf export" in r.stderr
    assert sorted(p.name for p in (tmp_path / "partial" / "exports").iterdir()) == ["model.gguf"]


@pytest.mark.parametrize(
    ("value", "message"),
    [("gguf,zip", "'zip' is not one of gguf, hf, onnx"), ("gguf,gguf", "names 'gguf' twice")],
)
def test_a_bad_list_is_refused_naming_the_option(
    tmp_path: Path, shakespeare: Path, value: str, message: str
) -> None:
    r = fromscratch("train", shakespeare, "--out", tmp_path / "x", "--export-formats", value)
    assert r.returncode == 2
    assert "--export-formats" in r.stderr and message in r.stderr, r.stderr
