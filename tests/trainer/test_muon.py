"""optimizer muon (trainer.optim.muon): which weights Muon trains, its update against torch.optim.Muon,
the schedule and weight decay of both halves, training, exact resume, refusals and the memory estimate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.conftest import SHAKESPEARE, train_losses
from tests.trainer.test_distributed import MODEL, one_process, two_ranks, weights
from tests.trainer.test_estimate import CONFIGS, model_config, nbytes, one_step, optimizer_tensors
from tests.trainer.test_resume import StopAfter, assert_bitwise_equal
from trainer.config import ConfigError, ModelConfig, TrainConfig
from trainer.config.estimate import estimate_memory
from trainer.distributed.launch import launch_train
from trainer.model.llama import Llama
from trainer.optim.adamw import AdamW
from trainer.optim.muon import MuonAdamW, orthogonalize
from trainer.optim.optimizers import lr_at, make_optimizer, set_lr
from trainer.run.loop import train

MATRICES = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


def fresh(**kw: object) -> Llama:
    torch.manual_seed(0)
    return Llama(ModelConfig(n_layer=2, n_head=2, n_embd=32, ctx=16, vocab_size=258, **kw))  # type: ignore[arg-type]


def train_steps(model: Llama, optimizer: Any, cfg: TrainConfig, steps: int) -> None:
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = torch.randint(0, 258, (4, 16), generator=gen)
        _, loss = model(x, x)
        assert loss is not None
        loss.backward()
        set_lr(optimizer, lr_at(step, cfg, steps))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("tied", [False, True])
def test_muon_trains_the_blocks_matrices_and_adamw_the_rest(tied: bool) -> None:
    model = fresh(tie_embeddings=tied)
    cfg = TrainConfig(optimizer="muon", learning_rate=2e-3, muon_learning_rate=0.05, weight_decay=0.1)
    optimizer = make_optimizer(model, cfg)
    assert isinstance(optimizer, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon, *adamw = optimizer.param_groups
    assert muon["muon"] and all(not g.get("muon") for g in adamw)
    assert sorted(names[id(p)] for p in muon["params"]) == sorted(
        f"layers.{i}.{part}.{m}.weight"
        for i in range(2)
        for part, ms in (("attention", MATRICES[:4]), ("feed_forward", MATRICES[4:]))
        for m in ms
    )
    in_adamw = sorted(names[id(p)] for g in adamw for p in g["params"])
    outside = ["norm.weight", "tok_embeddings.weight"] + ([] if tied else ["output.weight"])
    assert in_adamw == sorted(
        outside + [f"layers.{i}.{n}_norm.weight" for i in range(2) for n in ("attention", "ffn")]
    )
    # every trainable parameter exactly once
    assert len(muon["params"]) + len(in_adamw) == len(list(model.parameters()))

    # the schedule scales both peaks alike; the matrices shrink per step as much as under AdamW
    set_lr(optimizer, 1e-3)
    assert muon["lr"] == pytest.approx(0.025) and muon["momentum"] == 0.95
    assert muon["lr"] * muon["weight_decay"] == pytest.approx(1e-3 * 0.1)
    decay = adamw[0]
    assert decay["lr"] == 1e-3 and decay["weight_decay"] == 0.1 and decay["betas"] == (0.8, 0.95)
    if not tied:  # the untied embedding keeps its own rate, without decay
        assert adamw[-1]["params"] == [model.tok_embeddings.weight] and adamw[-1]["lr"] == pytest.approx(1e-2)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="this torch has no torch.optim.Muon")
def test_the_update_is_torchs_muon_and_our_adamw_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's Muon iterates in bfloat16 on every device; ours does on CUDA (float32 on a CPU)
    monkeypatch.setattr("trainer.optim.muon.newton_schulz_dtype", lambda device: torch.bfloat16)
    cfg = TrainConfig(optimizer="muon", muon_momentum=0.9, warmup_steps=2)
    ours, theirs = fresh(), fresh()
    train_steps(ours, make_optimizer(ours, cfg), cfg, 5)

    muon_group, *adamw_groups = make_optimizer(theirs, cfg).param_groups
    reference = torch.optim.Muon(
        muon_group["params"],
        lr=cfg.muon_learning_rate,
        weight_decay=muon_group["weight_decay"],
        momentum=0.9,
    )
    reference.param_groups[0]["lr_scale"] = muon_group["lr_scale"]
    adamw = AdamW(adamw_groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)

    class Both:  # the two reference optimizers as one
        param_groups = reference.param_groups + adamw.param_groups

        def step(self) -> None:
            reference.step()
            adamw.step()

        def zero_grad(self, set_to_none: bool = True) -> None:
            adamw.zero_grad(set_to_none)
            reference.zero_grad(set_to_none)

    train_steps(theirs, Both(), cfg, 5)
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_orthogonalize_sets_the_singular_values_near_one(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    for shape in ((16, 48), (48, 16)):
        matrix = torch.randn(shape, generator=g) * 1e-3
        out = orthogonalize(matrix, dtype)
        assert out.dtype == dtype and out.shape == shape
        s = torch.linalg.svdvals(out.float())
        assert 0.5 < float(s.min()) and float(s.max()) < 1.5
        # the same singular vectors: out = U S' V^T with U, V those of matrix
        u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
        core = u.T @ out.float() @ vh.T
        assert torch.allclose(core, torch.diag(torch.diagonal(core)), atol=0.05)
    assert torch.equal(orthogonalize(torch.zeros(4, 8)), torch.zeros(4, 8, dtype=torch.bfloat16))


def test_state_dict_round_trip_continues_exactly() -> None:
    cfg = TrainConfig(optimizer="muon")
    model = fresh()
    optimizer = make_optimizer(model, cfg)
    train_steps(model, optimizer, cfg, 3)
    saved = optimizer.state_dict()
    matrix, norm = saved["state"][0], saved["state"][len(optimizer.param_groups[0]["params"])]
    assert set(matrix) == {"momentum_buffer"} and set(norm) == {"step", "exp_avg", "exp_avg_sq"}

    copy = fresh()
    copy.load_state_dict(model.state_dict())
    resumed = make_optimizer(copy, cfg)
    resumed.load_state_dict(saved)
    train_steps(model, optimizer, cfg, 2)
    train_steps(copy, resumed, cfg, 2)
    for a, b in zip(model.parameters(), copy.parameters(), strict=True):
        assert torch.equal(a, b)


def test_muon_reduces_the_loss(tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer) -> None:
    cfg = tiny_train(max_steps=30, optimizer="muon")
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    losses = train_losses(tmp_path)
    assert result.last_train_loss is not None and result.last_train_loss < losses[0] - 1.5


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_pause_and_resume_is_bitwise_identical(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer, grad_accum: int
) -> None:
    cfg = tiny_train(max_steps=8, optimizer="muon", grad_accum=grad_accum, eval_every=3)
    straight = train(tiny_model(), cfg, shakespeare_data, tmp_path / "straight", tokenizer=byte_tokenizer)
    first = train(
        tiny_model(), cfg, shakespeare_data, tmp_path / "resumed", StopAfter(4), tokenizer=byte_tokenizer
    )
    assert first.stop_reason == "pause" and first.step == 4
    second = train(
        tiny_model(), cfg, shakespeare_data, tmp_path / "resumed", tokenizer=byte_tokenizer, resume=True
    )
    assert second.step == 8 and second.tokens_seen == straight.tokens_seen
    assert second.last_val_loss == straight.last_val_loss
    assert_bitwise_equal(tmp_path / "straight" / "final", tmp_path / "resumed" / "final")
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")


def test_resuming_with_another_optimizer_is_refused_naming_the_field(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
) -> None:
    train(tiny_model(), tiny_train(max_steps=2), shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    with pytest.raises(ConfigError) as err:
        train(
            tiny_model(),
            tiny_train(max_steps=4, optimizer="muon"),
            shakespeare_data,
            tmp_path,
            tokenizer=byte_tokenizer,
            resume=True,
        )
    assert err.value.param == "optimizer" and "resume it with optimizer adamw" in str(err.value)


def test_refusals_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        TrainConfig(optimizer="muon", devices=2, sharding="fsdp")
    assert err.value.param == "sharding" and "use ddp" in str(err.value)
    assert TrainConfig(optimizer="muon", devices=2).sharding == "ddp"  # DDP reduces grads before the step
    assert TrainConfig(optimizer="muon", sharding="fsdp").devices == 1  # fsdp does nothing in one process
    for values, problem in (
        ({"muon_momentum": 1.0}, ("muon_momentum", "must be < 1.0, got 1.0")),
        ({"muon_learning_rate": 0.0}, ("muon_learning_rate", "must be positive, got 0.0")),
        ({"optimizer": "sgd"}, ("optimizer", "must be one of 'adamw', 'lbfgs', 'muon'; got 'sgd'")),
    ):
        with pytest.raises(ConfigError) as err:
            TrainConfig(**values)  # type: ignore[arg-type]
        assert err.value.problems == [problem]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_estimate_counts_muons_state_exactly(name: str) -> None:
    model_cfg, train_cfg = model_config(name), TrainConfig(optimizer="muon", batch_size=3)
    torch.manual_seed(0)
    model = Llama(model_cfg)
    optimizer = make_optimizer(model, train_cfg)
    one_step(model, optimizer, train_cfg)
    assert estimate_memory(model_cfg, train_cfg, "cpu").optimizer == nbytes(optimizer_tensors(optimizer))
    adamw = estimate_memory(model_cfg, train_cfg.model_copy(update={"optimizer": "adamw"}), "cpu")
    assert estimate_memory(model_cfg, train_cfg, "cpu").optimizer < adamw.optimizer


def test_building_and_stepping_it_does_not_import_dynamo() -> None:
    code = (
        "import sys, torch\n"
        "from trainer.config import ModelConfig, TrainConfig\n"
        "from trainer.model.llama import Llama\n"
        "from trainer.optim.optimizers import make_optimizer\n"
        "m = Llama(ModelConfig(n_layer=1, n_head=2, n_embd=16, ctx=8, vocab_size=258))\n"
        "o = make_optimizer(m, TrainConfig(optimizer='muon'))\n"
        "x = torch.zeros(1, 8, dtype=torch.long); m(x, x)[1].backward()\n"
        "o.step(); o.zero_grad(); o.load_state_dict(o.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_two_ddp_processes_train_what_one_process_accumulating_twice_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDP averages the gradients before the step, so every rank orthogonalizes the same matrices."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks inherit it; the machine has 2 cores
    short = dict(optimizer="muon", batch_size=1, max_steps=6, eval_every=0, checkpoint_every=0)
    model = ModelConfig(**MODEL)
    two = launch_train(model, two_ranks(**short), SHAKESPEARE, tmp_path / "2")
    one = train(model, one_process(**short), SHAKESPEARE, tmp_path / "1")
    assert train_losses(tmp_path / "2") == pytest.approx(train_losses(tmp_path / "1"), rel=1e-5)
    mine, theirs = weights(two.final_checkpoint), weights(one.final_checkpoint)
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=1e-5, msg=name)
