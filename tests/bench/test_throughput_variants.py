"""bench/trainer_throughput.py's runs on CUDA, listed on the CPU (the list is built on the meta
device): which configs get the kernels A/B, the CUDA-graphed run and the reads-at-once run, and that
a reads-at-once run really reads at once (trainer/run/step_read.py's variable, set per run)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import trainer_throughput
from bench._run_plan import Budget, runs_within
from bench._timed_training import EnoughSteps, Variant, train_until_enough, variant_config
from bench.trainer_throughput import corpus_tokens
from tests.fake_clock import FakeClock
from trainer.config import model_config_from_preset
from trainer.config.metrics import StepMetrics
from trainer.data.prepare import TokenData
from trainer.run.report import Callbacks
from trainer.run.state import StartInfo
from trainer.run.step_read import ENV, deferred_reads_on


def cuda_labels(*options: str) -> list[tuple[str, str, str, str]]:
    args = trainer_throughput.parse_args(list(options))  # --device cpu: no GPU here
    return [row.variant.label for row in trainer_throughput.benchmark_rows(args, cuda=True)]


def test_the_kernels_ab_on_cuda_adds_the_torch_ops_and_the_reads_at_once_runs_of_llama_110m() -> None:
    labels = cuda_labels("--kernels-ab")
    eager_110m = [label[3] for label in labels if label[0] == "llama-110m" and label[2] == "off"]
    assert eager_110m == ["fused", "graphed", "torch", "fused (read at once)"]
    assert not any("read at once" in label[3] for label in labels if label[0] != "llama-110m")
    assert not any("read at once" in label[3] for label in cuda_labels())  # no A/B asked for


@pytest.mark.parametrize("at_once", [True, False])
def test_a_run_sets_the_late_reads_variable_for_itself(
    monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    """run_training's set-up of the variable, as train() will read it (the run itself stubbed)."""
    from bench import _timed_training

    seen: list[bool] = []
    monkeypatch.setattr(
        _timed_training, "train_until_enough", lambda *a: seen.append(deferred_reads_on("cuda"))
    )
    # the variable left by an earlier run says the opposite; the run's switches stay in the test
    monkeypatch.setattr(os, "environ", {**os.environ, ENV: "1" if at_once else "0"})
    model = model_config_from_preset("llama-tiny", vocab_size=258)
    variant = Variant("llama-tiny", model, 2, "fp32", reads_at_once=at_once)
    _timed_training.run_training(variant, None, _timed_training.torch.device("cpu"), 1, 1, 0.0, None, dict)  # type: ignore[arg-type]
    assert seen == [not at_once]  # at once: off on CUDA too; else the device's default (on for CUDA)
    assert (os.environ.get(ENV) == "0") is at_once


class _ParamsSeen(Callbacks):
    """Records the run's parameter count and ends it at its first step."""

    def __init__(self) -> None:
        self.n_params: int | None = None

    def on_start(self, info: StartInfo) -> None:
        self.n_params = info["n_params"]

    def on_step(self, metrics: StepMetrics) -> None:
        raise EnoughSteps


@pytest.mark.parametrize("vocab", [258, 300])
def test_a_timed_run_trains_the_vocabulary_its_config_names(vocab: int) -> None:
    """A config at nanoGPT's vocabulary (50304) timed with byte data must not turn back into a
    258-token model: train() sizes the model by its tokenizer (the H100 run of 2026-11-27 timed
    `llama-110m-v50k` at 258 that way)."""

    model = model_config_from_preset("llama-tiny", ctx=32, vocab_size=vocab)
    cfg = variant_config(Variant("llama-tiny", model, 2, "fp32"), torch.device("cpu"))
    seen = _ParamsSeen()
    train_until_enough(model, cfg, TokenData(train=corpus_tokens(20_000), val=None), seen)
    assert seen.n_params == model.num_params()


def test_on_cuda_the_issues_figures_run_first_and_the_diagnostics_last() -> None:
    """llama-110m eager graphed follows its plain eager run: the likeliest way to the eager goal."""
    labels = cuda_labels("--kernels-ab")
    first = [(name, compiled, kernels) for name, _, compiled, kernels in labels[:9]]
    assert first == [
        ("llama-110m", "off", "fused"), ("llama-110m", "off", "graphed"), ("llama-110m", "on", "fused"),
        ("llama-1.2b", "off", "fused"), ("llama-1.2b", "on", "fused"),
        ("llama-110m-v50k", "off", "fused"), ("llama-110m-v50k", "on", "fused"),
        ("llama-42m", "off", "fused"), ("llama-42m", "on", "fused"),
    ]  # fmt: skip
    assert {label[3] for label in labels[9:]} == {"torch", "fused (read at once)"}


def test_runs_start_until_the_budget_is_spent_and_every_other_round_goes_backwards() -> None:
    clock = FakeClock()
    rows = [
        trainer_throughput.Row(Variant(n, model_config_from_preset("llama-tiny"), 2, "fp32"), 1, 1)
        for n in "abc"
    ]
    order = [(rnd, row.variant.name) for rnd, row in runs_within(rows, 2, Budget(None, clock=clock))]
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a")]
    budget = Budget(10.0, clock=clock)
    started = []
    for _, row in runs_within(rows, 2, budget):
        started.append(row.variant.name)
        clock.now += 4.0  # each run takes 4 s: runs start at 0, 4 and 8, none at 12
    assert started == ["a", "b", "c"]


def test_a_graphed_run_whose_blocks_ran_eager_gives_no_graphed_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The trainer says why it did not capture (here: no CUDA); the run's eager steps are not the
    graphed variant's figures, and its table row says why it has none."""
    from bench._throughput_report import emit_rows

    args = trainer_throughput.parse_args(["--smoke"])
    model = model_config_from_preset("llama-tiny", ctx=32, vocab_size=258)
    row = trainer_throughput.Row(Variant("llama-tiny", model, 2, "fp32", graphs=True), 1, 1)
    meter = trainer_throughput.PeakMeter(torch.device("cpu"), (64,), 0.001)
    data = TokenData(train=corpus_tokens(20_000), val=None)
    trainer_throughput.run_round(row, args, data, meter, "round 1/1")
    assert row.tps == [] and row.left_out == "CUDA graphs off: needs CUDA"
    emit_rows([row], torch.device("cpu"))
    out = capsys.readouterr().out
    assert "left out, its blocks ran eager: CUDA graphs off: needs CUDA" in out
    assert '"item": "llama-tiny fp32 eager graphed: left out", "value": "CUDA graphs off: needs CUDA"' in out
