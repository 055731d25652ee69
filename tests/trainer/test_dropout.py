"""Dropout (TrainConfig.dropout): at 0 the model computes exactly what it computed before dropout
existed (no op in the graph, nothing drawn); above 0 it changes training only, never evaluation,
sampling or exports; it works through the fused CPU kernels, torch.compile and activation
checkpointing; its masks follow (seed, step, micro-batch), so a resumed run stays bitwise equal
(tests/trainer/test_distributed.py checks that two ranks draw what one process accumulating twice
draws)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.trainer.conftest import train_losses
from tests.trainer.test_resume import StopAfter, assert_bitwise_equal
from trainer.checkpoint import load_model, read_state
from trainer.config import ConfigError, ModelConfig, TrainConfig
from trainer.export import export
from trainer.model import cpu_kernels
from trainer.model.kv_cache import KVCache
from trainer.model.llama import Llama
from trainer.run.loop import train
from trainer.run.step import DropoutSeeds, dropout_seed, evaluate_batches
from trainer.sampling import generate_ids

MODEL = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ctx=16, vocab_size=50)


def model_pair(p: float) -> tuple[Llama, Llama]:
    """A model without dropout and one with dropout p, with the same weights, in training mode."""
    torch.manual_seed(0)
    plain = Llama(ModelConfig(**MODEL))
    torch.manual_seed(0)
    dropped = Llama(ModelConfig(**MODEL), dropout=p)
    return plain.train(), dropped.train()


X = torch.randint(0, MODEL["vocab_size"], (3, MODEL["ctx"]), generator=torch.Generator().manual_seed(1))
Y = X.roll(-1, dims=1)  # drawn here, outside the regions the tests watch


def loss_and_grads(model: Llama, seed: int = 7) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A seeded forward and backward in the model's mode; gradients cleared afterwards."""
    torch.manual_seed(seed)
    _, loss = model(X, Y)
    assert loss is not None
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros(()) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


class OpNames(TorchDispatchMode):
    """The aten ops a region dispatches, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def random_ops(names: set[str]) -> set[str]:
    return {n for n in names if "dropout" in n or "bernoulli" in n or "rand" in n}


def test_dropout_zero_adds_no_op_draws_nothing_and_keeps_the_flash_kernel() -> None:
    plain, zero = model_pair(0.0)
    _, dropped = model_pair(0.3)
    with OpNames() as ops:
        loss, grads = loss_and_grads(zero, seed=7)
    assert torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(7).get_state())  # no draw
    assert random_ops(ops.names) == set()
    assert "_scaled_dot_product_flash_attention_for_cpu" in ops.names
    ref_loss, ref_grads = loss_and_grads(plain)
    assert torch.equal(loss, ref_loss) and all(map(torch.equal, grads, ref_grads))
    with OpNames() as ops:
        loss_and_grads(dropped)
    assert random_ops(ops.names)  # the probe sees dropout where there is some


def test_dropout_changes_training_but_never_evaluation_or_sampling() -> None:
    plain, dropped = model_pair(0.5)
    train_loss, _ = loss_and_grads(dropped, seed=7)
    assert not torch.equal(train_loss, loss_and_grads(plain, seed=7)[0])
    assert not torch.equal(train_loss, loss_and_grads(dropped, seed=8)[0])  # fresh masks per seed
    assert torch.equal(train_loss, loss_and_grads(dropped, seed=7)[0])  # the seed decides the masks

    plain.eval()
    dropped.eval()
    x, y = X, Y
    with torch.no_grad():
        assert torch.equal(dropped(x)[0], plain(x)[0])
        caches = [KVCache(m.cfg, x.shape[0], x.device, torch.float32) for m in (dropped, plain)]
        prefill = [m(x[:, :8], cache=c)[0] for m, c in zip((dropped, plain), caches, strict=True)]
        step = [m(x[:, 8:9], cache=c)[0] for m, c in zip((dropped, plain), caches, strict=True)]
    assert torch.equal(prefill[0], prefill[1]) and torch.equal(step[0], step[1])
    dropped.train()  # generate_ids and evaluation switch to eval mode themselves
    plain.train()
    prompt = x[0, :4].tolist()
    assert generate_ids(dropped, prompt, 8, temperature=0) == generate_ids(plain, prompt, 8, temperature=0)
    evaluations = [evaluate_batches(m, [(x, y)], x.device, contextlib.nullcontext) for m in (dropped, plain)]
    assert evaluations[0] == evaluations[1] and dropped.training


def test_activation_checkpointing_recomputes_the_same_masks() -> None:
    _, dropped = model_pair(0.3)
    loss, grads = loss_and_grads(dropped)
    dropped.activation_checkpointing = True
    recomputed_loss, recomputed = loss_and_grads(dropped)
    assert torch.equal(loss, recomputed_loss)
    for a, b in zip(grads, recomputed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.fixture
def torch_ops_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fused CPU kernels switched off (FROMSCRATCH_CPU_KERNELS=0), and back on afterwards."""
    monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "0")
    cpu_kernels._load.cache_clear()
    yield
    monkeypatch.undo()
    cpu_kernels._load.cache_clear()


def test_the_cpu_kernels_draw_the_torch_ops_masks(request: pytest.FixtureRequest) -> None:
    """The dropouts sit outside the fused ops, so both paths draw the same masks in the same order."""
    _, dropped = model_pair(0.3)
    assert cpu_kernels.available()
    loss, grads = loss_and_grads(dropped)
    request.getfixturevalue("torch_ops_only")
    assert not cpu_kernels.available()
    ref_loss, ref_grads = loss_and_grads(dropped)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def run_config(tiny_train: Callable[..., TrainConfig], **kw: Any) -> TrainConfig:
    return tiny_train(**{"max_steps": 8, "export_formats": [], **kw})


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "torch-ops"])
def test_training_with_dropout_lowers_the_loss(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tiny_model: Callable[..., ModelConfig],
    tiny_train: Callable[..., TrainConfig],
    shakespeare_data: Any,
    byte_tokenizer: Any,
    kernels: bool,
) -> None:
    if not kernels:
        request.getfixturevalue("torch_ops_only")
    assert cpu_kernels.available() == kernels
    cfg = run_config(tiny_train, max_steps=40, dropout=0.2)
    train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    losses = train_losses(tmp_path)
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5]), losses


def test_a_resumed_run_with_dropout_is_bitwise_the_straight_run(
    tmp_path: Path,
    tiny_model: Callable[..., ModelConfig],
    tiny_train: Callable[..., TrainConfig],
    shakespeare_data: Any,
    byte_tokenizer: Any,
) -> None:
    cfg = run_config(tiny_train, dropout=0.3, grad_accum=2, eval_every=3)
    data, tok = shakespeare_data, byte_tokenizer
    straight = train(tiny_model(), cfg, data, tmp_path / "straight", tokenizer=tok)
    first = train(tiny_model(), cfg, data, tmp_path / "resumed", StopAfter(4), tokenizer=tok)
    assert first.step == 4
    second = train(tiny_model(), cfg, data, tmp_path / "resumed", tokenizer=tok, resume=True)
    assert second.step == straight.step == 8 and straight.final_checkpoint is not None
    assert_bitwise_equal(straight.final_checkpoint, tmp_path / "resumed" / "final")
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")

    # dropout acted, and left the run's own RNG stream (checkpointed) as a run without it leaves it
    plain_cfg = run_config(tiny_train, grad_accum=2, eval_every=3)
    plain = train(tiny_model(), plain_cfg, data, tmp_path / "plain", tokenizer=tok)
    assert plain.final_checkpoint is not None
    assert train_losses(tmp_path / "plain") != train_losses(tmp_path / "straight")
    assert read_state(plain.final_checkpoint)["rng"] == read_state(straight.final_checkpoint)["rng"]


def test_every_micro_batch_of_the_global_batch_gets_its_own_masks() -> None:
    """Rank r's i-th micro-batch is micro-batch r * grad_accum + i of the step's global batch: the
    ranks' masks differ from each other's and equal what one process accumulating draws."""
    seeds = {dropout_seed(1337, step, micro) for step in range(50) for micro in range(8)}
    assert len(seeds) == 400 and dropout_seed(1337, 3, 1) == dropout_seed(1337, 3, 1)

    class Run:  # the TrainRun fields DropoutSeeds reads
        def __init__(self, rank: int, grad_accum: int) -> None:
            self.cfg = TrainConfig(dropout=0.1, grad_accum=grad_accum, device="cpu")
            self.device, self.rank, self.step = torch.device("cpu"), rank, 5

    def masks(rank: int, grad_accum: int, i: int) -> torch.Tensor:
        seeds = DropoutSeeds(Run(rank, grad_accum))  # type: ignore[arg-type]
        with seeds.step():
            seeds.micro_batch(i)
            return torch.rand(4)

    state = torch.get_rng_state()
    assert not torch.equal(masks(0, 1, 0), masks(1, 1, 0))
    assert torch.equal(masks(1, 2, 0), masks(0, 4, 2))  # 2 ranks x 2 = 1 process x 4
    assert torch.equal(torch.get_rng_state(), state)  # the generator put back after the step


def test_a_dropout_runs_checkpoint_exports_what_the_model_evaluates(
    tmp_path: Path,
    tiny_model: Callable[..., ModelConfig],
    tiny_train: Callable[..., TrainConfig],
    shakespeare_data: Any,
    byte_tokenizer: Any,
) -> None:
    import onnxruntime

    result = train(
        tiny_model(),
        run_config(tiny_train, dropout=0.5),
        shakespeare_data,
        tmp_path,
        tokenizer=byte_tokenizer,
    )
    assert result.final_checkpoint is not None
    model, _ = load_model(result.final_checkpoint)
    assert model.dropout == 0.0  # dropout is training's, not the model's
    path = export(result.final_checkpoint, "onnx", tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.arange(40, 72, dtype=np.int64).reshape(1, 32)
    (theirs,) = session.run(["logits"], {"input_ids": ids})
    with torch.no_grad():
        ours = model(torch.from_numpy(ids))[0].numpy()
    assert np.abs(theirs - ours).max() <= 1e-4


def test_compiled_dropout_follows_the_seed_and_evaluates_like_eager() -> None:
    _, dropped = model_pair(0.3)
    compiled = torch.compile(dropped)

    def step(seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(seed)
        _, loss = compiled(X, Y)
        loss.backward()
        grads = [p.grad.clone() for p in dropped.parameters() if p.grad is not None]
        dropped.zero_grad(set_to_none=True)
        return loss.detach(), grads

    loss, grads = step(1)
    again, grads_again = step(1)
    assert torch.equal(loss, again) and all(map(torch.equal, grads, grads_again))
    assert not torch.equal(loss, step(2)[0])
    assert all(torch.isfinite(g).all() for g in grads)
    dropped.eval()
    x = X
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], dropped(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value", [-0.1, 0.95])
def test_dropout_out_of_bounds_names_the_field(value: float) -> None:
    with pytest.raises(ConfigError) as err:
        TrainConfig(dropout=value)
    assert err.value.param == "dropout" and ("0.9" in str(err.value) or ">= 0" in str(err.value))
    with pytest.raises(ValueError, match="dropout"):
        Llama(ModelConfig(**MODEL), dropout=1.0)


@pytest.mark.cuda(devices=1)
def test_on_cuda_attention_dropout_stays_in_the_flash_kernel_and_follows_the_seed() -> None:
    from torch.profiler import ProfilerActivity, profile

    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=128, ctx=128, vocab_size=258)
    torch.manual_seed(0)
    model = Llama(cfg, dropout=0.2).cuda()
    x = torch.randint(0, 258, (4, cfg.ctx), device="cuda")

    def loss(seed: int) -> torch.Tensor:
        torch.cuda.manual_seed(seed)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, value = model(x, x)
        value.backward()
        model.zero_grad(set_to_none=True)
        return value.detach()

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        first = loss(1)
        torch.cuda.synchronize()
    kernels = [e.key for e in prof.key_averages()]
    assert any("flash" in k.lower() for k in kernels), kernels
    assert torch.equal(first, loss(1)) and not torch.equal(first, loss(2))
    model.eval()
    with torch.no_grad():
        plain = Llama(cfg).cuda().eval()
        plain.load_state_dict(model.state_dict())
        assert torch.equal(model(x)[0], plain(x)[0])
