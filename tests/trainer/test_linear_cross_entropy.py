"""The chunked output projection + cross-entropy (trainer.model.linear_cross_entropy) against the plain
F.cross_entropy(F.linear(h, w).float(), t): the same loss, gradients and argmax in float32, bfloat16
and under autocast, with ignored targets, with no target, chunked or not; the same through the whole
Llama (FROMSCRATCH_FUSED_CROSS_ENTROPY=1 against 0), under torch.compile too; and fewer bytes kept
for the backward, which the memory estimate counts."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F

from trainer.config import ModelConfig, TrainConfig
from trainer.config.estimate import estimate_memory
from trainer.config.fused_loss import ENV
from trainer.model.linear_cross_entropy import linear_cross_entropy
from trainer.model.llama import IGNORE_INDEX, Llama

N, C, V = 37, 24, 50
SMALL_CHUNK = 4 * V * 5  # 5 rows per chunk: 8 chunks, the last of 2 rows


def inputs(dtype: torch.dtype, ignored: int = 0, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, C, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(V, C, generator=g) * 0.3).to(dtype).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    t[torch.randperm(N, generator=g)[:ignored]] = IGNORE_INDEX
    return h, w, t


def plain(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, reduction: str) -> tuple[torch.Tensor, ...]:
    logits = F.linear(h, w).float()
    loss = F.cross_entropy(logits, t, ignore_index=IGNORE_INDEX, reduction=reduction)
    return (loss, logits.argmax(dim=1), *_grads(loss, h, w))


def fused(
    h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, reduction: Literal["mean", "sum"], chunk: int
) -> tuple[torch.Tensor, ...]:
    loss, argmax = linear_cross_entropy(h, w, t, IGNORE_INDEX, reduction, chunk_bytes=chunk)
    return (loss, argmax, *_grads(loss, h, w))


def _grads(loss: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    for t in tensors:
        t.grad = None
    loss.backward()
    return tuple(t.grad for t in tensors)


def assert_same(ours: tuple[Any, ...], theirs: tuple[Any, ...], rtol: float, atol: float) -> None:
    torch.testing.assert_close(ours[0], theirs[0], rtol=rtol, atol=atol, equal_nan=True)
    assert torch.equal(ours[1], theirs[1])  # argmax
    for a, b in zip(ours[2:], theirs[2:], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignored", [0, 9])
@pytest.mark.parametrize("chunk", [SMALL_CHUNK, 4 * V * N, 1], ids=["chunked", "one-chunk", "row-by-row"])
def test_float32_matches_the_plain_path(reduction: Literal["mean", "sum"], ignored: int, chunk: int) -> None:
    h, w, t = inputs(torch.float32, ignored)
    assert_same(fused(h, w, t, reduction, chunk), plain(h, w, t, reduction), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_no_target_at_all_behaves_as_f_cross_entropy(reduction: Literal["mean", "sum"]) -> None:
    """A mean over no target is NaN, with zero gradients; a sum is 0."""
    h, w, t = inputs(torch.float32, ignored=N)
    ours, theirs = fused(h, w, t, reduction, SMALL_CHUNK), plain(h, w, t, reduction)
    assert ours[0].isnan().item() == (reduction == "mean") == theirs[0].isnan().item()
    assert_same(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_bfloat16_matches_the_plain_path(reduction: Literal["mean", "sum"]) -> None:
    h, w, t = inputs(torch.bfloat16, ignored=5)
    assert_same(fused(h, w, t, reduction, SMALL_CHUNK), plain(h, w, t, reduction), rtol=2e-2, atol=2e-2)


def test_autocast_runs_the_matmuls_as_autocast_would() -> None:
    """The model's case: bf16 hidden states from the final norm, float32 master weights."""
    h, w, t = inputs(torch.float32, ignored=5)
    h = h.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = fused(h, w, t, "mean", SMALL_CHUNK)
        theirs = plain(h, w, t, "mean")
    assert ours[3] is not None and ours[3].dtype == torch.float32  # the weight's gradient
    assert_same(ours, theirs, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("frozen", ["hidden", "weight", "both"])
def test_inputs_without_gradients(frozen: str) -> None:
    h, w, t = inputs(torch.float32, ignored=3)
    h.requires_grad_(frozen == "weight")
    w.requires_grad_(frozen == "hidden")
    loss, argmax = linear_cross_entropy(h, w, t, IGNORE_INDEX, chunk_bytes=SMALL_CHUNK)
    expected = F.cross_entropy(F.linear(h, w), t, ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    if frozen == "both":
        assert not loss.requires_grad
        return
    loss.backward()
    assert (h.grad is None) == (frozen == "hidden") and (w.grad is None) == (frozen == "weight")


def test_no_grad_computes_no_gradient() -> None:
    """Evaluation (torch.no_grad) gets the loss and argmax and keeps nothing for a backward."""
    h, w, t = inputs(torch.float32)
    saved: list[torch.Tensor] = []
    with (
        torch.no_grad(),
        torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x),
    ):
        loss, argmax = linear_cross_entropy(h, w, t, IGNORE_INDEX, "sum")
    assert not saved and not loss.requires_grad
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(h, w), t, reduction="sum"))
    assert torch.equal(argmax, F.linear(h, w).argmax(dim=1))


def saved_bytes(fn: Any) -> int:
    """Bytes autograd keeps for the backward of what fn computes (each storage once)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_keeps_fewer_bytes_for_the_backward() -> None:
    """With V large against C, the logits' log-softmax (N x V float32) dwarfs the two gradients
    (N x C and V x C) kept in its place."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(512, 32, generator=g, requires_grad=True)
    w = torch.randn(4096, 32, generator=g, requires_grad=True)
    t = torch.randint(0, 4096, (512,), generator=g)
    ours = saved_bytes(lambda: linear_cross_entropy(h, w, t, chunk_bytes=1 << 20))
    theirs = saved_bytes(lambda: F.cross_entropy(F.linear(h, w).float(), t))
    assert ours == 4 * (512 * 32 + 4096 * 32)
    assert theirs >= 4 * 512 * 4096 > 4 * ours


TINY = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ctx=16, vocab_size=300)


def llama_step(
    monkeypatch: pytest.MonkeyPatch, fused_on: bool, model: Any, autocast: bool = False
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], str]:
    """(argmax, loss, every parameter's gradient, the loss's backward node) of a training forward +
    backward with argmax=True."""
    monkeypatch.setenv(ENV, "1" if fused_on else "0")
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, TINY.vocab_size, (3, TINY.ctx), generator=g)
    y = torch.roll(x, -1, dims=1)
    y[0, :5] = IGNORE_INDEX
    params = list(model.parameters()) if isinstance(model, Llama) else list(model._orig_mod.parameters())
    for p in params:
        p.grad = None
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with bf16:
        predicted, loss = model(x, y, argmax=True)
    assert loss is not None and loss.grad_fn is not None
    loss.backward()
    grads = [p.grad.clone() for p in params if p.grad is not None]
    return predicted, loss.detach(), grads, type(loss.grad_fn).__name__


@pytest.mark.parametrize("tied", [False, True])
def test_llama_with_and_without_the_fused_loss(monkeypatch: pytest.MonkeyPatch, tied: bool) -> None:
    torch.manual_seed(0)
    model = Llama(TINY.model_copy(update={"tie_embeddings": tied}))
    on, off = llama_step(monkeypatch, True, model), llama_step(monkeypatch, False, model)
    assert (on[3], off[3]) == ("_LinearCrossEntropyBackward", "NllLossBackward0")  # the paths taken
    assert torch.equal(on[0], off[0])
    torch.testing.assert_close(on[1], off[1], rtol=1e-5, atol=1e-6)
    assert len(on[2]) == len(off[2]) == len(list(model.parameters()))
    for a, b in zip(on[2], off[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_llama_under_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Llama(TINY)
    on, off = llama_step(monkeypatch, True, model, True), llama_step(monkeypatch, False, model, True)
    torch.testing.assert_close(on[1], off[1], rtol=1e-2, atol=1e-2)
    for a, b in zip(on[2], off[2], strict=True):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-3)


def test_compiled_training_step_with_the_variable_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile traces the plain path (the fused function steps aside while compiling)."""
    torch.manual_seed(0)
    model = Llama(TINY)
    eager = llama_step(monkeypatch, True, model)
    compiled = llama_step(monkeypatch, True, torch.compile(model))
    assert torch.equal(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(compiled[2], eager[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_estimate_counts_the_fused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the loss runs fused, the activation estimate drops the logits and still bounds what
    autograd saves."""
    model_cfg, train_cfg = TINY.model_copy(update={"vocab_size": 2000}), TrainConfig(batch_size=3)
    monkeypatch.setenv(ENV, "0")
    plain_estimate = estimate_memory(model_cfg, train_cfg, "cpu")
    monkeypatch.setenv(ENV, "1")
    fused_estimate = estimate_memory(model_cfg, train_cfg, "cpu")
    assert fused_estimate.activations < plain_estimate.activations
    assert fused_estimate.backward_working < plain_estimate.backward_working
    torch.manual_seed(0)
    model = Llama(model_cfg)
    x = torch.randint(0, model_cfg.vocab_size, (3, model_cfg.ctx))
    owned = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if (ptr := t.untyped_storage().data_ptr()) not in owned:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x.roll(-1, dims=1), argmax=True)
    assert sum(storages.values()) <= fused_estimate.activations
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    tracker = mem_tracker.MemTracker()
    tracker.track_external(model, x)
    with tracker:  # a whole forward + backward (the optimizer's state is the same for both paths)
        model(x, x.roll(-1, dims=1), argmax=True)[1].backward()
    peak = sum(stats["Total"] for stats in tracker.get_tracker_snapshot("peak").values())
    assert peak <= fused_estimate.training_peak - fused_estimate.runtime - fused_estimate.optimizer
    monkeypatch.delenv(ENV)  # the defaults: fused on CUDA, plain on the CPU
    assert estimate_memory(model_cfg, train_cfg, "cpu") == plain_estimate
    cuda = estimate_memory(model_cfg, train_cfg, "cuda")
    assert (
        cuda.activations
        < estimate_memory(model_cfg, train_cfg.model_copy(update={"dtype": "float16"}), "cuda").activations
    )


@pytest.mark.cuda(devices=1)
def test_cuda_bf16_matches_and_lowers_the_peak() -> None:
    """On CUDA in bf16 (the default there): the plain path's values, and a lower peak for a forward +
    backward at N = 8192 rows, V = 32000, C = 512 (the plain path's float32 logits: 1 GiB each)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(8192, 512, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(32000, 512, device="cuda", generator=g) * 0.05).requires_grad_()
    t = torch.randint(0, 32000, (8192,), device="cuda", generator=g)
    t[:100] = IGNORE_INDEX

    def peak(fn: Any) -> tuple[int, tuple[torch.Tensor, ...]]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out

    plain_peak, theirs = peak(lambda: plain(h, w, t, "mean"))
    fused_peak, ours = peak(lambda: fused(h, w, t, "mean", 256 << 20))
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-3, atol=1e-3)
    assert (ours[1] == theirs[1]).float().mean() > 0.99  # bf16 ties may break either way
    for a, b in zip(ours[2:], theirs[2:], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    assert fused_peak < plain_peak / 2, (fused_peak, plain_peak)
