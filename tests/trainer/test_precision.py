"""trainer.run.precision: what dtype auto and compile auto become, with their reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.config import TrainConfig
from trainer.run import precision
from trainer.run.precision import choose_compile, choose_dtype

CPU = torch.device("cpu")


def test_a_cpu_without_native_bf16_trains_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "fma"})
    choice = choose_dtype(TrainConfig(dtype="auto"), CPU)
    assert choice.value == "float32" and "no native bfloat16" in choice.reason


@pytest.mark.parametrize(("bf16_rate", "expected"), [(4.0e10, "bfloat16"), (1.0e10, "float32")])
def test_native_bf16_is_chosen_only_where_the_probe_finds_it_faster(
    monkeypatch: pytest.MonkeyPatch, bf16_rate: float, expected: str
) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    rates = {torch.float32: 1.0e10, torch.bfloat16: bf16_rate}
    monkeypatch.setattr(precision, "matmul_rate", lambda device_type, dtype, one_thread=False: rates[dtype])
    choice = choose_dtype(TrainConfig(dtype="auto"), CPU)
    assert choice.value == expected and "avx512_bf16" in choice.reason and "matmul probe" in choice.reason


def test_an_explicit_dtype_is_kept() -> None:
    assert choose_dtype(TrainConfig(dtype="bfloat16"), CPU) == precision.Choice("bfloat16", "asked for")


def test_compile_auto_waits_for_a_run_long_enough_to_pay_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "matmul_rate", lambda device_type, dtype, one_thread=False: 1.0e11)
    cfg = TrainConfig()
    flops = 1.0e11  # 2 s a step at half the probe's rate
    short = choose_compile(cfg, CPU, "float32", flops, steps=100)  # 200 s
    assert short.value == "off" and "estimated at 3 min, under 20x" in short.reason
    long = choose_compile(cfg, CPU, "float32", flops, steps=10_000)  # 5.6 h > 20 x 100 s
    assert long.value == "on" and "over 20x" in long.reason
    assert choose_compile(TrainConfig(compile=True), CPU, "float32", flops, 1) == precision.Choice(
        "on", "asked for"
    )
    assert choose_compile(TrainConfig(compile=False), CPU, "float32", flops, 10**6).value == "off"


def test_the_probe_measures_a_positive_rate() -> None:
    assert precision.matmul_rate("cpu", torch.float32) > 0


def test_the_dtype_probe_runs_on_one_thread_and_gives_the_threads_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dtypes are compared on one CPU thread (a matmul on all threads of a busy CPU reads anything);
    the run's thread count is restored after."""
    seen: list[int] = []
    matmul = torch.Tensor.__matmul__

    def counting(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return matmul(a, b)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(torch.Tensor, "__matmul__", counting)
    precision.matmul_rate.cache_clear()
    try:
        assert precision.matmul_rate("cpu", torch.float32, one_thread=True) > 0
        assert set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        precision.matmul_rate.cache_clear()
        torch.set_num_threads(threads)


def test_a_time_limit_caps_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "matmul_rate", lambda device_type, dtype, one_thread=False: 1.0e11)
    choice = choose_compile(TrainConfig(time_limit=60), CPU, "float32", 1.0e11, steps=10**6)
    assert choice.value == "off" and "estimated at 60 s" in choice.reason


def test_a_resumed_auto_run_keeps_the_dtype_auto_chose_for_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
) -> None:
    """The probe is a timing: resumed on a busier machine it may come out the other way, and the run
    would change precision half-way. A resumed run takes the checkpoint's choice instead."""
    from trainer.run import setup
    from trainer.run.loop import train
    from trainer.run.report import Callbacks

    class StartRecorder(Callbacks):
        def on_start(self, info: dict) -> None:  # type: ignore[override]
            self.info = info

    def auto_says(value: str) -> None:
        monkeypatch.setattr(setup, "choose_dtype", lambda cfg, device: precision.Choice(value, "auto: probe"))

    def started(steps: int, out: Path, resume: Path | None = None) -> dict:
        recorder = StartRecorder()
        cfg = tiny_train(max_steps=steps, dtype="auto")
        train(
            tiny_model(),
            cfg,
            shakespeare_data,
            out,
            recorder,
            tokenizer=byte_tokenizer,
            resume=resume or False,
        )
        return recorder.info

    auto_says("bfloat16")
    first = started(2, tmp_path)
    auto_says("float32")
    resumed = started(4, tmp_path, resume=tmp_path / "final")
    assert first["dtype"] == resumed["dtype"] == "bfloat16"
    assert resumed["dtype_reason"] == "auto: as the run this resumes (auto: probe)"
    again = started(6, tmp_path, resume=tmp_path / "final")  # once more: the first reason, not nested
    assert again["dtype_reason"] == "auto: as the run this resumes (auto: probe)"
    fresh = started(2, tmp_path / "new")
    assert fresh["dtype"] == "float32"  # a fresh run asks the probe
