"""Every Triton kernel launch of the CUDA path, compiled for an H100 (sm_90) on this CPU: Triton
builds PTX and, with the ptxas its wheel carries, a cubin without a GPU. The interpreter
(triton_cases.py) checks what the kernels compute but runs their Python, not the compiler, so a
kernel it passes can still fail to build (a type that differs between an if's branches, a block
shape the compiler rejects). The launches are recorded, not run, from the real wrappers of
trainer.model.triton_ops on CPU tensors, each tile candidate forced in turn, so the signatures
compiled are the ones the code passes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from trainer.model import triton_kernels as tk
from trainer.model import triton_ops
from trainer.model.kernel_tiles import TileTable

triton = pytest.importorskip("triton", reason="never skipped: the test extra installs triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
HOPPER_SHARED_BYTES = 227 * 1024  # the most shared memory one H100 block may take
POINTER_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64"}
KERNELS = [name for name in dir(tk) if name.endswith("_kernel")]


@dataclass(frozen=True)
class Launch:
    kernel: str
    signature: tuple[tuple[str, str], ...]  # (parameter, Triton type) of every runtime parameter
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int


def arg_type(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    assert isinstance(value, float), value
    return "fp32"


class Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records the launch's signature."""

    def __init__(self, name: str, jit: Any, launches: set[Launch]):
        self.name, self.jit, self.launches = name, jit, launches

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def record(*args: object, **kwargs: Any) -> None:
            num_warps = kwargs.pop("num_warps", 4)
            params = dict(zip(self.jit.arg_names, args, strict=False)) | kwargs
            constexpr = {p.name for p in self.jit.params if p.is_constexpr}
            signature = tuple((n, arg_type(v)) for n, v in params.items() if n not in constexpr)
            constexprs = tuple((n, v) for n, v in params.items() if n in constexpr)
            self.launches.add(Launch(self.name, signature, constexprs, num_warps))

        return record


@contextmanager
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[Launch]]:
    launches: set[Launch] = set()
    for name in KERNELS:
        monkeypatch.setattr(tk, name, Recorder(name, getattr(tk, name), launches))
    yield launches


def every_tile(table: TileTable, run: Callable[[], object]) -> None:
    for tile in table.candidates:
        with table.forced(tile):
            run()


def training_launches() -> None:
    """Each wrapper as a bf16 training step of llama-110m's widths calls it (GQA heads too)."""
    B, T, H, KV, hd, d, ff, vocab = 2, 64, 12, 4, 64, 768, 2048, 50304
    x = torch.randn(B, T, d, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.ones(d)

    def rms_norm() -> None:
        y = triton_ops.RMSNorm.apply(x, weight, 1e-5, torch.bfloat16, True)
        y.backward(torch.ones_like(y))

    every_tile(triton_ops.RMS_FORWARD_TILES, rms_norm)
    every_tile(triton_ops.RMS_BACKWARD_TILES, rms_norm)
    h = torch.randn(B, T, 2 * ff, dtype=torch.bfloat16, requires_grad=True)
    y = triton_ops.SwiGLU.apply(h)
    y.backward(torch.ones_like(y))
    qkv = torch.randn(B, T, H + 2 * KV, hd, dtype=torch.bfloat16, requires_grad=True)
    tables = triton_ops.rope_tables(torch.ones(T, hd), torch.zeros(T, hd))

    def split() -> None:
        q, k, v = triton_ops.QKV.apply(qkv, *tables, (H, KV), torch.bfloat16)
        torch.autograd.grad((q, k, v), (qkv,), [torch.ones_like(t) for t in (q, k, v)])

    every_tile(triton_ops.ROPE_TILES, split)
    logits = torch.randn(B * T, vocab, dtype=torch.bfloat16)
    targets, argmax = torch.zeros(B * T, dtype=torch.int64), torch.empty(B * T, dtype=torch.int64)
    scale = torch.ones((), dtype=torch.float32)
    every_tile(
        triton_ops.CROSS_ENTROPY_TILES,
        lambda: triton_ops.cross_entropy_rows(logits, targets, -100, scale, argmax, logits),
    )
    triton_ops.cross_entropy_rows(logits, targets, -100, scale, argmax, None)  # evaluation: no gradient


def decoding_launches() -> None:
    B, H, KV, hd, ctx = 2, 12, 4, 64, 128
    qkv = torch.randn(B, 1, H + 2 * KV, hd, dtype=torch.bfloat16)
    caches = tuple(torch.zeros(B, KV, ctx, hd, dtype=torch.bfloat16) for _ in range(2))
    tables = triton_ops.rope_tables(torch.ones(1, hd), torch.zeros(1, hd))
    triton_ops.decode_qkv(qkv, tables, (H, KV), torch.bfloat16, caches, torch.zeros(1, dtype=torch.int64))


def test_every_kernel_launch_compiles_for_an_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    with recorded(monkeypatch) as launches:
        training_launches()
        decoding_launches()
    assert {launch.kernel for launch in launches} == set(KERNELS), "a kernel the launches never reach"
    for launch in sorted(launches, key=repr):
        jit = getattr(tk, launch.kernel).jit
        source = ASTSource(fn=jit, signature=dict(launch.signature), constexprs=dict(launch.constexprs))
        try:
            compiled = triton.compile(source, target=HOPPER, options={"num_warps": launch.num_warps})
        except Exception as error:  # the test's finding: which launch, and the compiler's words
            pytest.fail(f"{launch} does not compile for sm_90: {error}")
        assert compiled.asm["cubin"], launch
        assert compiled.metadata.shared <= HOPPER_SHARED_BYTES, (
            f"{launch} needs more shared memory than an H100"
        )
