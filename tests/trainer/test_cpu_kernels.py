"""The fused C kernels of the CPU path (trainer/model/cpu_kernels.c): each computes what the torch-op
autograd functions of trainer/model/fused_ops.py compute, forward and backward, over awkward shapes; a
model step through them equals the step through torch ops; they are built once and reused; where
they cannot be built the model falls back to torch ops and says why."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer.config import ModelConfig
from trainer.model import cpu_kernels
from trainer.model.fused_ops import _QKV, _QKVKernel, _RMSNorm, _RMSNormKernel, _SwiGLU, _SwiGLUKernel
from trainer.model.llama import Llama, rope_cache


@pytest.fixture
def fresh_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty kernel cache, and _load() forgetting what it loaded before (restored afterwards)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu_kernels._load.cache_clear()
    yield tmp_path / "fromscratch" / "cpu-kernels"
    monkeypatch.undo()
    cpu_kernels._load.cache_clear()


def test_the_kernels_build_on_this_machine() -> None:
    # The suite runs on Linux with gcc (llama-cpp-python builds with it too), so the kernel path is
    # what these tests exercise, not the fallback.
    assert sys.platform == "linux"
    assert shutil.which("cc") or shutil.which("gcc")
    assert cpu_kernels.available(), cpu_kernels.description()
    assert cpu_kernels.description().startswith("fused C kernels (cpu_kernels-")


def test_loading_the_kernels_leaves_torchs_float_environment_alone() -> None:
    # A -ffast-math library linked by gcc < 13 turns on flush-to-zero for the whole process when it
    # loads (crtfastmath.o): torch's ops would then lose their subnormal numbers.
    assert cpu_kernels.available()
    assert (torch.tensor([1e-39]) * 0.5).item() == pytest.approx(5e-40, rel=1e-5)


def _leaf(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).requires_grad_()


def _grads(out: torch.Tensor | tuple[torch.Tensor, ...], inputs: list[torch.Tensor], seed: int = 1) -> list:
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(o.shape, generator=g) for o in outs]
    return list(torch.autograd.grad(outs, inputs, upstream))


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (2, 16, 128), (4, 3, 130)])
def test_rms_norm_kernel_matches_torch_ops(shape: tuple[int, ...]) -> None:
    x, w = _leaf(*shape, scale=3.0), _leaf(shape[-1], seed=2)
    ours, ref = _RMSNormKernel.apply(x, w, 1e-5), _RMSNorm.apply(x, w, 1e-5, torch.float32)
    _close(ours, ref)
    for a, b in zip(_grads(ours, [x, w]), _grads(ref, [x, w]), strict=True):
        _close(a, b)


def test_rms_norm_weight_gradient_does_not_depend_on_the_thread_count() -> None:
    x, w = _leaf(512, 96), _leaf(96, seed=2)
    assert x.numel() >= cpu_kernels.GRAIN_SIZE  # big enough to be split among threads
    threads = torch.get_num_threads()
    try:
        grads = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            grads.append(_grads(_RMSNormKernel.apply(x, w, 1e-5), [w])[0])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grads[0], g) for g in grads[1:])  # fixed row blocks, summed in order


@pytest.mark.parametrize("width", [1, 5, 352])
def test_swiglu_kernel_matches_torch_ops(width: int) -> None:
    h = _leaf(2, 3, 2 * width, scale=4.0)
    with torch.no_grad():  # saturated gates: exp overflows to inf in the sigmoid, which must not leak
        h[0, 0, :width] = torch.linspace(-100, 100, width)
    ours, ref = _SwiGLUKernel.apply(h), _SwiGLU.apply(h)
    _close(ours, ref)
    grad = _grads(ours, [h])[0]
    _close(grad, _grads(ref, [h])[0])
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize(
    "n_head,n_kv_head,head_dim,rope_dims",
    [(4, 4, 8, None), (4, 2, 6, 4), (2, 1, 32, 16), (1, 1, 2, None)],
)
def test_qkv_kernel_matches_torch_ops(
    n_head: int, n_kv_head: int, head_dim: int, rope_dims: int | None
) -> None:
    cfg = ModelConfig(
        n_head=n_head, n_kv_head=n_kv_head, n_embd=n_head * head_dim, ctx=7, rope_dims=rope_dims
    )
    cos, sin = rope_cache(cfg, 7)
    qkv = _leaf(3, 7, n_head + 2 * n_kv_head, head_dim)
    heads = (n_head, n_kv_head)
    ours = _QKVKernel.apply(qkv, cos, sin, heads)
    ref = _QKV.apply(qkv, cos.unsqueeze(1), sin.unsqueeze(1), heads, torch.float32)
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape and a.is_contiguous()
        _close(a, b)
    _close(_grads(ours, [qkv])[0], _grads(ref, [qkv])[0])


def _model_step(cfg: ModelConfig) -> tuple[float, dict[str, torch.Tensor], torch.Tensor]:
    """Loss, gradients and no-grad logits of one step of a seeded model."""
    torch.manual_seed(0)
    model = Llama(cfg)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.ctx), generator=torch.Generator().manual_seed(1))
    _, loss = model(x, x.roll(1, dims=1))
    loss.backward()
    with torch.no_grad():
        logits = model(x)[0]
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, logits


def test_a_model_step_through_the_kernels_equals_the_torch_ops_step(
    fresh_build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ctx=32, vocab_size=80, rope_dims=8)
    loss, grads, logits = _model_step(cfg)
    assert cpu_kernels.available()
    monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "0")
    cpu_kernels._load.cache_clear()
    assert not cpu_kernels.available() and "FROMSCRATCH_CPU_KERNELS=0" in cpu_kernels.description()
    ref_loss, ref_grads, ref_logits = _model_step(cfg)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    _close(logits, ref_logits)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_library_is_built_once_and_reused(fresh_build: Path) -> None:
    assert cpu_kernels.available()
    (built,) = fresh_build.glob("cpu_kernels-*.so")
    stamp = built.stat().st_mtime_ns
    cpu_kernels._load.cache_clear()
    assert cpu_kernels.available() and cpu_kernels.description() == f"fused C kernels ({built.name})"
    assert built.stat().st_mtime_ns == stamp and list(fresh_build.iterdir()) == [built]  # no temp left


def test_without_a_working_compiler_the_model_uses_torch_ops(
    fresh_build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "/bin/false")
    assert not cpu_kernels.available()
    assert cpu_kernels.description().startswith("torch ops (fused kernels unavailable: /bin/false failed")
    assert not list(fresh_build.glob("*"))  # nothing half-built left in the cache
    h = _leaf(2, 6)
    assert cpu_kernels.for_run("cpu", torch.float32, compiled=False) == cpu_kernels.description()
    from trainer.model.fused_ops import swiglu

    _close(swiglu(h), _SwiGLU.apply(h))  # the fallback computes the same
