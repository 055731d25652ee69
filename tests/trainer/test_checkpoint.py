"""Checkpoint folders: layout, exact round trips (weights, optimizer, RNG), atomicity, rotation, best/."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import read_metrics
from trainer.checkpoint import (
    CheckpointError,
    get_rng_state,
    latest_checkpoint,
    load_checkpoint,
    load_model,
    load_optimizer_state,
    rotate_checkpoints,
    save_checkpoint,
    set_rng_state,
)
from trainer.config import TrainConfig
from trainer.model.llama import Llama
from trainer.optim.optimizers import make_optimizer
from trainer.run.loop import train

FILES = {"model.safetensors", "optimizer.safetensors", "config.json", "tokenizer.json", "state.json"}


def _trained_model_and_optimizer(cfg, train_cfg):
    torch.manual_seed(0)
    model = Llama(cfg)
    opt = make_optimizer(model, train_cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.ctx))

    def closure():
        opt.zero_grad()
        _, loss = model(x, x)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    return model, opt


@pytest.mark.parametrize("optimizer", ["adamw", "lbfgs", "muon"])
def test_round_trip_is_exact(tmp_path, tiny_model, byte_tokenizer, optimizer):
    cfg = tiny_model(tie_embeddings=True)
    train_cfg = TrainConfig(optimizer=optimizer, learning_rate=0.1 if optimizer == "lbfgs" else 1e-3)
    model, opt = _trained_model_and_optimizer(cfg, train_cfg)
    path = save_checkpoint(
        tmp_path / "ck",
        model=model,
        model_config=cfg,
        train_config=train_cfg,
        tokenizer=byte_tokenizer,
        optimizer=opt,
        state={"step": 3, "tokens_seen": 99, "best_val_loss": None, "sampler": None, "total_steps": 10},
    )
    assert {p.name for p in path.iterdir()} == FILES
    assert not list(tmp_path.glob("*.tmp-*"))

    stored = load_file(str(path / "model.safetensors"))
    assert "output.weight" not in stored  # tied weights stored once
    ckpt = load_checkpoint(path)
    assert ckpt.step == 3 and ckpt.state["tokens_seen"] == 99 and ckpt.state["format_version"] == 1
    assert ckpt.model_config == cfg and ckpt.train_config == train_cfg
    assert ckpt.tokenizer.to_json() == byte_tokenizer.to_json()
    for name, tensor in model.state_dict().items():
        assert torch.equal(ckpt.model_state[name], tensor), name
    assert json.loads((path / "config.json").read_text())["model"]["n_embd"] == 32

    loaded, tok = load_model(path)
    assert loaded.output.weight is loaded.tok_embeddings.weight and not loaded.training
    assert tok.vocab_size == 258

    # optimizer state: rebuild a fresh optimizer for the same model and load into it
    fresh = make_optimizer(model, train_cfg)
    load_optimizer_state(fresh, model, path, ckpt.state["optimizer_meta"])
    names = {id(p): n for n, p in model.named_parameters()}

    def flat(o):
        out = {}
        for p, st in o.state.items():
            for k, v in st.items():
                items = v if isinstance(v, list) else [v]
                for i, item in enumerate(items):
                    out[(names[id(p)], k, i)] = item
        return out

    a, b = flat(opt), flat(fresh)
    assert a.keys() == b.keys() and a
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_rng_state_round_trip():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = json.loads(json.dumps(get_rng_state()))  # must survive JSON
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    set_rng_state(state)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_overwrite_is_atomic_and_leaves_no_temp(tmp_path, tiny_model, byte_tokenizer):
    cfg = tiny_model()
    model = Llama(cfg)
    kw = dict(model=model, model_config=cfg, train_config=TrainConfig(), tokenizer=byte_tokenizer)
    save_checkpoint(tmp_path / "final", state={"step": 1, "tokens_seen": 0}, **kw)
    save_checkpoint(tmp_path / "final", state={"step": 2, "tokens_seen": 0}, **kw)
    assert load_checkpoint(tmp_path / "final").step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_failed_write_leaves_previous_checkpoint(tmp_path, tiny_model, byte_tokenizer):
    cfg = tiny_model()
    model = Llama(cfg)
    kw = dict(model=model, model_config=cfg, train_config=TrainConfig())
    save_checkpoint(tmp_path / "ck", tokenizer=byte_tokenizer, state={"step": 1, "tokens_seen": 0}, **kw)

    class Broken:
        def to_json(self):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "ck", tokenizer=Broken(), state={"step": 2, "tokens_seen": 0}, **kw)
    assert load_checkpoint(tmp_path / "ck").step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_loading_never_unpickles(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer, monkeypatch
):
    train(tiny_model(), tiny_train(max_steps=2), shakespeare_data, tmp_path, tokenizer=byte_tokenizer)

    def forbidden(*args, **kwargs):
        raise AssertionError("torch.load / pickle used")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr("pickle.load", forbidden)
    monkeypatch.setattr("pickle.loads", forbidden)
    load_model(tmp_path / "final")
    result = train(
        tiny_model(),
        tiny_train(max_steps=3),
        shakespeare_data,
        tmp_path,
        tokenizer=byte_tokenizer,
        resume=True,
    )
    assert result.step == 3


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load_checkpoint(tmp_path)


def test_rotation_keeps_newest_and_best(tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer):
    cfg = tiny_train(max_steps=10, checkpoint_every=2, keep_checkpoints=2, eval_every=2)
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000006", "step-00000008"]
    vals = [(m["step"], m["val_loss"]) for m in read_metrics(tmp_path) if "val_loss" in m]
    best_step, best_val = min(vals, key=lambda v: v[1])
    best = load_checkpoint(tmp_path / "best")
    assert best.step == best_step and best.state["best_val_loss"] == best_val == result.best_val_loss
    assert not (tmp_path / "best" / "optimizer.safetensors").exists()  # a model, not a resume point
    assert latest_checkpoint(tmp_path) == tmp_path / "final"


def test_rotate_checkpoints_directly(tmp_path, tiny_model, byte_tokenizer):
    cfg = tiny_model()
    model = Llama(cfg)
    for step in (1, 2, 3, 4):
        save_checkpoint(
            tmp_path / f"step-{step:08d}",
            model=model,
            model_config=cfg,
            train_config=TrainConfig(),
            tokenizer=byte_tokenizer,
            state={"step": step, "tokens_seen": 0},
        )
    (tmp_path / "step-00000005.tmp-999999").mkdir()  # leftover of a crashed writer
    removed = rotate_checkpoints(tmp_path, 3)
    assert [p.name for p in removed] == ["step-00000001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003", "step-00000004"]
    assert latest_checkpoint(tmp_path.parent / "nothing-here") is None
