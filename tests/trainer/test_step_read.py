"""A logged step's numbers read one step late (trainer.run.step_read), CUDA's default, run here on
the CPU (FROMSCRATCH_DEFERRED_READS=1): the same report as reading at once, each step reported
after the next one is queued, and a NaN loss still caught before an evaluation or a checkpoint
uses its weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import trainer.run.loop as loop_module
from tests.trainer.conftest import read_metrics
from tests.trainer.test_loop import Recorder
from trainer.run.loop import TrainResult, train
from trainer.run.report import TrainingDiverged
from trainer.run.step_read import ENV, QueuedRead, deferred_reads_on

# what differs between two runs of the same steps: when they happened, and how fast
CLOCK_FIELDS = {"time", "tokens_per_s", "peak_memory_bytes"}


class BatchCounter(Recorder):
    """A Recorder that also notes how many training batches had been drawn at each on_step."""

    def __init__(self, drawn: list[int], **kwargs: Any):
        super().__init__(**kwargs)
        self.drawn, self.drawn_at_report = drawn, []

    def on_step(self, metrics: Any) -> None:
        super().on_step(metrics)
        self.drawn_at_report.append((metrics.step, self.drawn[0]))


def run_counting(
    monkeypatch: pytest.MonkeyPatch,
    deferred: bool,
    out: Path,
    stop_at: int | None = None,
    **train_kwargs: Any,
) -> tuple[BatchCounter, TrainResult]:
    """One training run (the caller's model, config and data in train_kwargs), its reads late or not."""
    monkeypatch.setenv(ENV, "1" if deferred else "0")
    drawn = [0]
    real_next_batch = loop_module.next_batch

    def counting_next_batch(*args: Any) -> Any:
        drawn[0] += 1
        return real_next_batch(*args)

    monkeypatch.setattr(loop_module, "next_batch", counting_next_batch)
    rec = BatchCounter(drawn, stop_at=stop_at)
    result = train(out_dir=out, callbacks=rec, **train_kwargs)
    return rec, result


def without_clock(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k not in CLOCK_FIELDS} for m in metrics]


def test_the_rule_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert deferred_reads_on("cuda") and not deferred_reads_on("cpu")
    monkeypatch.setenv(ENV, "1")
    assert deferred_reads_on("cpu")
    monkeypatch.setenv(ENV, "0")
    assert not deferred_reads_on("cuda")


def test_a_queued_read_on_the_cpu_gives_its_values() -> None:
    queued = QueuedRead.queue(7, 896, 1e-3, torch.tensor([2.5, 0.75, 0.5, 0.0]))
    assert queued.copied is None and queued.read() == [2.5, 0.75, 0.5, 0.0]
    assert (queued.step, queued.tokens_seen, queued.lr) == (7, 896, 1e-3)


def test_late_reads_report_what_reading_at_once_does(
    monkeypatch, tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    cfg = tiny_train(max_steps=7, log_every=2, eval_every=5, checkpoint_every=4, keep_checkpoints=5)
    kwargs = dict(
        model_cfg=tiny_model(), train_cfg=cfg, train_path=shakespeare_data, tokenizer=byte_tokenizer
    )
    at_once, result_a = run_counting(monkeypatch, False, tmp_path / "a", **kwargs)
    late, result_b = run_counting(monkeypatch, True, tmp_path / "b", **kwargs)

    assert without_clock(read_metrics(tmp_path / "a")) == without_clock(read_metrics(tmp_path / "b"))
    assert [s[:4] + s[5:] for s in at_once.steps] == [s[:4] + s[5:] for s in late.steps]
    assert [s for s, _ in at_once.checkpoints] == [s for s, _ in late.checkpoints] == [4]
    assert at_once.evals == late.evals and [s for s, _ in late.evals] == [5, 7]
    assert result_a.last_train_loss == result_b.last_train_loss is not None
    # at once: a step is reported before the next batch is drawn. Late: after the next step is
    # queued, except before a checkpoint (step 4) or an evaluation (7, also the end)
    assert at_once.drawn_at_report == [(2, 2), (4, 4), (6, 6), (7, 7)]
    assert late.drawn_at_report == [(2, 3), (4, 4), (6, 7), (7, 7)]


def test_a_stop_asked_for_comes_a_step_later_and_every_step_is_reported(
    monkeypatch, tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    # the Recorder asks to pause once it has seen step 3: reading late, it sees step 3 after step
    # 4 is queued, so the run pauses after step 4, and reports step 4 before its checkpoint
    kwargs = dict(
        model_cfg=tiny_model(),
        train_cfg=tiny_train(max_steps=50),
        train_path=shakespeare_data,
        tokenizer=byte_tokenizer,
    )
    rec, result = run_counting(monkeypatch, True, tmp_path, stop_at=3, **kwargs)
    assert result.stop_reason == "pause" and result.step == 4
    assert [s[0] for s in rec.steps] == [1, 2, 3, 4]
    assert rec.checkpoints == [(4, tmp_path / "checkpoints" / "step-00000004")]


@pytest.mark.parametrize("checkpoint_every", [0, 4])
def test_a_nan_loss_read_late_still_ends_the_run_at_its_step(
    monkeypatch, tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer, checkpoint_every
):
    # a loss that turns NaN from the 4th forward pass on; with a checkpoint due at step 4, the run
    # ends before writing it, as it does reading at once
    import torch.nn.functional as F

    real_cross_entropy = F.cross_entropy
    calls = {"n": 0}

    def poisoned(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["n"] += 1
        loss = real_cross_entropy(*args, **kwargs)
        return loss * float("nan") if calls["n"] >= 4 else loss

    monkeypatch.setattr(F, "cross_entropy", poisoned)
    monkeypatch.setenv(ENV, "1")
    cfg = tiny_train(
        max_steps=20, eval_every=0, warmup_steps=0, schedule="constant", checkpoint_every=checkpoint_every
    )
    with pytest.raises(TrainingDiverged, match="diverged at step 4"):
        train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    assert calls["n"] == (4 if checkpoint_every == 4 else 5)  # late: step 5 ran before the read
    assert not (tmp_path / "checkpoints" / "step-00000004").exists()


@pytest.mark.cuda(devices=1)
def test_a_queued_read_on_cuda_waits_for_its_copy_not_for_later_work() -> None:
    values = torch.tensor([2.5, 0.75, 0.5, 0.0], device="cuda")
    queued = QueuedRead.queue(1, 128, 1e-3, values)
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued after the copy
    assert queued.read() == [2.5, 0.75, 0.5, 0.0] and queued.values.is_pinned()
    assert not torch.cuda.current_stream().query()  # the later work still runs: not waited for
    torch.cuda.synchronize()
