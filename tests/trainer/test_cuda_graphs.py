"""cuda_graphs: the transformer blocks replayed as CUDA graphs in training. On the CPU: when a run
may use them and why not, and that the model takes the captured steps for a training input of
their shape only (the steps run ungraphed here, so their values are the eager blocks'). On a GPU
(`-m cuda`): graphed training follows the eager run's losses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.trainer.conftest import train_losses
from trainer.config import ModelConfig, TrainConfig
from trainer.model.graphed_blocks import BlockStep, GraphedBlocks
from trainer.model.llama import Llama
from trainer.run import cuda_graphs
from trainer.run.cuda_graphs import unusable
from trainer.run.loop import TrainResult, train
from trainer.run.report import Callbacks

MODEL = dict(n_layer=2, n_head=2, n_embd=128, ctx=128)  # head_dim 64: SDPA's flash kernel takes it


class Notes(Callbacks):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def on_note(self, message: str) -> None:
        self.notes.append(message)


def run_with(**changes: Any) -> SimpleNamespace:
    cfg = SimpleNamespace(
        resolved_dropout=0.0, grad_accum=1, activation_checkpointing=False, optimizer="adamw"
    )
    run = SimpleNamespace(device=torch.device("cuda"), world=1, precision={"compile": False}, cfg=cfg)
    for key, value in changes.items():
        setattr(cfg if hasattr(cfg, key) else run, key, value)
    return run


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({}, None),
        ({"device": torch.device("cpu")}, "needs CUDA"),
        ({"world": 2}, "one process only"),
        ({"resolved_dropout": 0.1}, "needs dropout 0"),
        ({"grad_accum": 2}, "needs grad_accum 1"),
        ({"activation_checkpointing": True}, "not with activation checkpointing"),
        ({"precision": {"compile": True}}, "not with torch.compile"),
        ({"optimizer": "lbfgs"}, "not with L-BFGS"),
    ],
)
def test_when_a_run_may_graph_its_blocks(changes: dict[str, Any], reason: str | None) -> None:
    found = unusable(run_with(**changes))  # type: ignore[arg-type]
    assert found == reason if reason is None else found is not None and found.startswith(reason)


def test_a_cpu_run_asking_for_graphs_trains_eager_and_says_why(
    tmp_path: Path, shakespeare_data: Any, byte_tokenizer: Any, tiny_train: Callable[..., TrainConfig]
) -> None:
    notes = Notes()
    result = train(
        ModelConfig(n_layer=1, n_head=2, n_embd=32, ctx=32),
        tiny_train(max_steps=3, eval_every=0, cuda_graphs=True),
        shakespeare_data,
        tmp_path,
        notes,
        tokenizer=byte_tokenizer,
    )
    assert result.stop_reason == "completed"
    assert "CUDA graphs off: needs CUDA" in notes.notes


def test_the_model_takes_the_captured_steps_for_their_training_input_only() -> None:
    torch.manual_seed(0)
    model = Llama(ModelConfig(n_layer=2, n_head=2, n_embd=32, ctx=16, vocab_size=50))
    idx = torch.randint(0, 50, (2, 16))
    _, eager_loss = model(idx, idx)
    calls: list[int] = []
    steps = tuple(BlockStep(block) for block in model.layers)
    for i, step in enumerate(steps):
        step.register_forward_hook(lambda *args, i=i: calls.append(i))
    model.graphed_blocks = GraphedBlocks(steps, torch.zeros(2, 16, 32, requires_grad=True))
    _, loss = model(idx, idx)
    assert calls == [0, 1] and loss is not None and eager_loss is not None
    torch.testing.assert_close(loss, eager_loss)  # ungraphed here: the blocks' own values
    loss.backward()
    assert all(p.grad is not None for p in model.layers.parameters())
    model(idx[:1], idx[:1])  # another batch shape
    with torch.no_grad():
        model(idx, idx)  # no gradient: evaluation
    model.eval()
    model(idx, idx)
    assert calls == [0, 1], "a step ran for an input it was not captured for"


@pytest.mark.cuda(devices=1)
def test_graphed_training_follows_the_eager_run_on_cuda(
    tmp_path: Path, shakespeare_data: Any, byte_tokenizer: Any, tiny_train: Callable[..., TrainConfig]
) -> None:
    run = dict(device="cuda", dtype="bfloat16", compile=False, dropout=0.0, max_steps=12, batch_size=8)
    run |= dict(eval_every=6, eval_batches=2)  # evaluations between graphed steps run the eager blocks
    notes = Notes()
    for name, graphs in (("eager", False), ("graphed", True)):
        result = train(
            ModelConfig(**MODEL),
            tiny_train(**run, cuda_graphs=graphs),
            shakespeare_data,
            tmp_path / name,
            notes if graphs else None,
            tokenizer=byte_tokenizer,
        )
        assert result.stop_reason == "completed"
    assert any(note.startswith("CUDA graphs on at step 1") for note in notes.notes), notes.notes
    eager, graphed = train_losses(tmp_path / "eager"), train_losses(tmp_path / "graphed")
    print("eager", eager, "\ngraphed", graphed)
    np.testing.assert_allclose(graphed, eager, rtol=2e-2)  # the same kernels, replayed


def stand_in_for_capture(monkeypatch: pytest.MonkeyPatch, capture: Callable[..., tuple[Any, ...]]) -> None:
    """CUDA's capture replaced by `capture`, and the device check passed: the glue runs on the CPU."""
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", capture)
    monkeypatch.setattr(cuda_graphs, "unusable", lambda run: None)


def train_two_blocks(out: Path, cfg: TrainConfig, data: Any, tokenizer: Any) -> tuple[TrainResult, Notes]:
    """A 2-layer model trained into `out`; its result and the notes of its run."""
    notes = Notes()
    result = train(
        ModelConfig(n_layer=2, n_head=2, n_embd=32, ctx=32), cfg, data, out, notes, tokenizer=tokenizer
    )
    return result, notes


def test_a_run_that_may_graph_captures_after_its_first_step_and_its_steps_take_the_graphs(
    tmp_path: Path,
    shakespeare_data: Any,
    byte_tokenizer: Any,
    tiny_train: Callable[..., TrainConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The glue on the CPU: CUDA's capture stood in for by the identity (the blocks run as they
    are), the device check passed. The captured shape must be the training batch's, or the
    steps would quietly run the eager blocks."""
    captured: list[int] = []
    ran: list[int] = []

    def identity(steps: tuple[torch.nn.Module, ...], samples: tuple[Any, ...]) -> tuple[Any, ...]:
        captured.append(len(steps))
        for step in steps:
            step.register_forward_hook(lambda *args: ran.append(1))
        return steps

    stand_in_for_capture(monkeypatch, identity)
    cfg = tiny_train(max_steps=4, eval_every=2, cuda_graphs=True, compile=False)
    _, notes = train_two_blocks(tmp_path, cfg, shakespeare_data, byte_tokenizer)
    assert captured == [2] and "CUDA graphs on at step 1: 2 blocks captured" in notes.notes[0]
    assert "matches the eager block to 0.0e+00" in notes.notes[0]
    # the check at capture replays the first block once; then steps 2 to 4, two blocks each, go
    # through the captured steps (evaluation does not)
    assert len(ran) == 1 + 3 * 2


class Shifted(torch.nn.Module):
    """A "capture" that recorded something else: the block's output, shifted."""

    def __init__(self, step: torch.nn.Module):
        super().__init__()
        self.step = step

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.step(x, cos, sin) + 1.0


def failing(steps: tuple[torch.nn.Module, ...], samples: tuple[Any, ...]) -> tuple[Any, ...]:
    raise RuntimeError("operation not permitted when stream is capturing\nmore detail")


def shifted(steps: tuple[torch.nn.Module, ...], samples: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(Shifted(step) for step in steps)


@pytest.mark.parametrize(
    "capture, note",
    [
        (
            failing,
            "CUDA graphs off: capturing the blocks failed (operation not permitted when stream is capturing)",
        ),
        (shifted, "CUDA graphs off: a captured block's replay differs from the eager block by"),
    ],
)
def test_a_capture_that_fails_or_disagrees_leaves_the_run_eager(
    capture: Callable[..., tuple[Any, ...]],
    note: str,
    tmp_path: Path,
    shakespeare_data: Any,
    byte_tokenizer: Any,
    tiny_train: Callable[..., TrainConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed capture, or one whose replay is not the eager block's computation, is said in the
    run's output and the run trains on eager, to the same losses as a run that never asked."""
    stand_in_for_capture(monkeypatch, capture)
    losses = {}
    for name, graphs in (("asked", True), ("plain", False)):
        cfg = tiny_train(max_steps=3, eval_every=0, cuda_graphs=graphs, compile=False)
        result, notes = train_two_blocks(tmp_path / name, cfg, shakespeare_data, byte_tokenizer)
        assert result.stop_reason == "completed"
        losses[name] = train_losses(tmp_path / name)
        if graphs:
            assert len(notes.notes) == 1 and notes.notes[0].startswith(note), notes.notes
    assert losses["asked"] == losses["plain"]
