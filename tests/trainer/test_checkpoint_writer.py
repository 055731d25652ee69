"""Checkpoints written in the background (issue 22, item 4): the folder holds the state of the step
the snapshot was taken at, whatever training did meanwhile; one write in flight at most; the
follow-up runs on the training thread; a failed write raises there; older kept step checkpoints
drop their optimizer state and a run resumes from one without it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import read_metrics
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.checkpoint_snapshot import OPTIMIZER_FILE, HostBuffers, take_snapshot
from trainer.config import TrainConfig
from trainer.model.llama import Llama
from trainer.optim.optimizers import make_optimizer
from trainer.run.checkpoint_writer import CheckpointWriter
from trainer.run.loop import train


def _stepped(cfg: Any, train_cfg: TrainConfig) -> tuple[Llama, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Llama(cfg)
    opt = make_optimizer(model, train_cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.ctx))
    _, loss = model(x, x)
    loss.backward()
    opt.step()
    return model, opt


def _taker(model: Llama, opt: torch.optim.Optimizer, cfg: Any, train_cfg: TrainConfig, tokenizer: Any) -> Any:
    def take(buffers: HostBuffers) -> Any:
        return take_snapshot(
            model=model,
            model_config=cfg,
            train_config=train_cfg,
            tokenizer=tokenizer,
            state={"step": 1, "tokens_seen": 0},
            optimizer=opt,
            buffers=buffers,
        )

    return take


def test_a_background_write_holds_the_snapshot_step_not_what_training_did_after(
    tmp_path: Path, tiny_model: Any, byte_tokenizer: Any
) -> None:
    cfg, train_cfg = tiny_model(), TrainConfig()
    model, opt = _stepped(cfg, train_cfg)
    sync = save_checkpoint(
        tmp_path / "sync",
        model=model,
        model_config=cfg,
        train_config=train_cfg,
        tokenizer=byte_tokenizer,
        state={"step": 1, "tokens_seen": 0},
        optimizer=opt,
    )
    writer = CheckpointWriter()
    followed_on: list[int] = []
    writer.save(
        _taker(model, opt, cfg, train_cfg, byte_tokenizer),
        tmp_path / "bg",
        lambda: followed_on.append(threading.get_ident()),
    )
    with torch.no_grad():  # "training" goes on while the folder is written
        for p in model.parameters():
            p.add_(1.0)
        for state in opt.state.values():
            state["exp_avg"].add_(1.0)
    writer.wait()
    assert followed_on == [threading.get_ident()]  # the follow-up ran here, on the training thread
    for name in ("model.safetensors", OPTIMIZER_FILE):
        want, got = load_file(str(sync / name)), load_file(str(tmp_path / "bg" / name))
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), name
    assert writer.times.count == 1 and writer.times.bytes > 0


def test_one_write_in_flight_and_its_error_raises_on_the_training_thread(
    tmp_path: Path, tiny_model: Any, byte_tokenizer: Any
) -> None:
    cfg, train_cfg = tiny_model(), TrainConfig()
    model, opt = _stepped(cfg, train_cfg)
    take = _taker(model, opt, cfg, train_cfg, byte_tokenizer)
    writer = CheckpointWriter()
    writer.save(take, tmp_path / "first", None)
    seen: list[bool] = []

    def take_second(buffers: HostBuffers) -> Any:
        seen.append((tmp_path / "first" / "state.json").exists())  # the first is complete by now
        return take(buffers)

    writer.save(take_second, tmp_path / "second", None)
    writer.wait()
    assert seen == [True] and (tmp_path / "second" / "state.json").exists()

    (tmp_path / "blocked").write_text("a file where the folder's parent should be")
    writer.save(take, tmp_path / "blocked" / "ckpt", None)
    with pytest.raises(OSError):
        writer.wait()
    writer.wait()  # raised once: the writer is usable again
    writer.close()


def test_older_step_checkpoints_drop_their_optimizer_state_and_a_resume_needs_none(
    tmp_path: Path, tiny_model: Any, tiny_train: Any, shakespeare_data: Any, byte_tokenizer: Any
) -> None:
    cfg = tiny_train(max_steps=9, checkpoint_every=2, keep_checkpoints=3, eval_every=0)
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    steps = sorted((tmp_path / "checkpoints").iterdir())
    assert [p.name for p in steps] == ["step-00000004", "step-00000006", "step-00000008"]
    assert [(p / OPTIMIZER_FILE).exists() for p in steps] == [False, False, True]
    assert result.checkpoint_times.count == 4  # steps 2, 4, 6 and 8, each in the background
    # a resume from a weights-only checkpoint starts the optimizer afresh instead of failing, and says so
    from tests.trainer.test_loop import Recorder

    recorder, exact = Recorder(), Recorder()
    resumed = train(
        tiny_model(),
        tiny_train(max_steps=5),
        shakespeare_data,
        tmp_path / "again",
        recorder,
        tokenizer=byte_tokenizer,
        resume=steps[0],
    )
    assert resumed.step == 5 and load_checkpoint(steps[0]).step == 4
    assert recorder.started is not None
    assert any("holds no optimizer state" in note for note in recorder.started["notes"])
    train(
        tiny_model(),
        tiny_train(max_steps=10),
        shakespeare_data,
        tmp_path / "exact",
        exact,
        tokenizer=byte_tokenizer,
        resume=steps[-1],
    )
    assert exact.started is not None and not any("optimizer" in note for note in exact.started["notes"])


def test_best_model_snapshots_are_counted_apart_from_the_step_checkpoints(
    tmp_path: Path, tiny_model: Any, tiny_train: Any, shakespeare_data: Any, byte_tokenizer: Any
) -> None:
    cfg = tiny_train(max_steps=9, checkpoint_every=4, eval_every=2)
    times = train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer).checkpoint_times
    assert times.resumable == 2  # steps 4 and 8; the last step's is written at the end
    losses = [m["val_loss"] for m in read_metrics(tmp_path) if "val_loss" in m]
    new_bests = sum(loss < min(losses[:i], default=float("inf")) for i, loss in enumerate(losses))
    assert times.weights_only == new_bests >= 2  # best/ is written at each new best
    assert times.count == times.resumable + times.weights_only
    summary = times.summary()
    assert summary is not None and summary.endswith(
        f"2 step checkpoints, {times.weights_only} best-model snapshots (best/)"
    )


def test_a_pauses_checkpoint_is_counted_as_written_at_the_end(
    tmp_path: Path, tiny_model: Any, tiny_train: Any, shakespeare_data: Any, byte_tokenizer: Any
) -> None:
    """The pause's step checkpoint is written on the training thread as the run ends: `at_end`, apart
    from the background ones (the worker's event counts both, as its uploads hold both)."""
    from tests.trainer.test_resume import StopAfter

    cfg = tiny_train(max_steps=20, checkpoint_every=2, eval_every=0)
    result = train(
        tiny_model(), cfg, shakespeare_data, tmp_path, callbacks=StopAfter(5), tokenizer=byte_tokenizer
    )
    times = result.checkpoint_times
    assert result.step == 5 and (tmp_path / "checkpoints" / "step-00000005").is_dir()
    assert (times.count, times.at_end) == (2, 1)  # steps 2 and 4 in the background, 5 at the pause
    summary = times.summary()
    assert summary is not None and summary.endswith(
        "0 best-model snapshots (best/), and 1 step checkpoint as training ended"
    )
