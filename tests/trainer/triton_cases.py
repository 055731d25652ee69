"""The Triton kernels (trainer/model/triton_ops.py) against the plain torch ops they replace, forward
and backward, in float32 and bfloat16. Not collected by itself (no test_ prefix):
tests/trainer/test_triton_kernels.py runs this file in a process of its own, under Triton's
interpreter on a CPU (TRITON_INTERPRET=1, set before Triton loads) and on the GPU with -m cuda."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from trainer.model import triton_ops
from trainer.model.kernel_tiles import Tile

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


def leaf(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype).requires_grad_()


def ref_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    xf = x.double()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.double()).to(out_dtype)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [48, 100])  # a power of two's share, and a padded row
def test_rms_norm(out_dtype: torch.dtype, width: int) -> None:
    check_rms_norm(out_dtype, width, rows=(3, 5))


@pytest.mark.parametrize("tile", triton_ops.RMS_BACKWARD_TILES.candidates, ids=str)
def test_rms_norm_backward_with_every_tile(tile: Tile) -> None:
    """111 rows over at most 4 x SMs programs: each program loops over several tiles, the last
    of them partly past its rows (the tile a run picks by timing must compute the same values)."""
    with triton_ops.RMS_BACKWARD_TILES.forced(tile):
        check_rms_norm(torch.bfloat16, 100, rows=(3, 37))
        test_add_rms_norm(torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("tile", triton_ops.RMS_FORWARD_TILES.candidates, ids=str)
def test_rms_norm_forward_with_every_tile(tile: Tile) -> None:
    """111 rows: the last program of every tile but one row's is partly past the rows."""
    with triton_ops.RMS_FORWARD_TILES.forced(tile):
        check_rms_norm(torch.bfloat16, 100, rows=(3, 37))
        test_add_rms_norm(torch.bfloat16, torch.bfloat16)


def check_rms_norm(out_dtype: torch.dtype, width: int, rows: tuple[int, int]) -> None:
    x, w = leaf(*rows, width), leaf(width, seed=1)
    grad = torch.randn(*rows, width).to(DEVICE, out_dtype)
    y = triton_ops.RMSNorm.apply(x, w, 1e-5, out_dtype, True)
    assert y.dtype == out_dtype and y.shape == x.shape
    dx, dw = torch.autograd.grad(y, (x, w), grad)
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    y2 = ref_rms_norm(x2, w2, 1e-5, out_dtype)
    dx2, dw2 = torch.autograd.grad(y2, (x2, w2), grad)
    close(y, y2, out_dtype)
    close(dx, dx2, out_dtype)
    close(dw, dw2, out_dtype)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype


@pytest.mark.parametrize(
    ("h_dtype", "out_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)]
)
def test_add_rms_norm(h_dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    """The residual add fused into the norm: the sum, the norm and the gradients of x, h (in h's
    dtype: a bf16 branch beside the float32 residual) and the weight, as the add and the norm; 111
    rows, so a tile's last program is partly past them. Without a gradient, the same two outputs."""
    x, h, w = leaf(3, 37, 100), leaf(3, 37, 100, dtype=h_dtype, seed=1), leaf(100, seed=2)
    ds, dy = torch.randn(3, 37, 100).to(DEVICE), torch.randn(3, 37, 100).to(DEVICE, out_dtype)
    s, y = triton_ops.AddRMSNorm.apply(x, h, w, 1e-5, out_dtype)
    assert (s.dtype, y.dtype) == (torch.float32, out_dtype)
    grads = torch.autograd.grad((s, y), (x, h, w), (ds, dy))
    x2, h2, w2 = (t.detach().requires_grad_() for t in (x, h, w))
    s2 = x2 + h2
    y2 = ref_rms_norm(s2, w2, 1e-5, out_dtype)
    expected = torch.autograd.grad((s2, y2), (x2, h2, w2), (ds, dy))
    torch.testing.assert_close(s, s2, rtol=0, atol=0)  # one float32 add, the same one
    close(y, y2, out_dtype)
    for ours, theirs, dtype in zip(grads, expected, (torch.float32, h_dtype, torch.float32), strict=True):
        assert ours.dtype == theirs.dtype == dtype
        close(ours, theirs, h_dtype)
    with torch.no_grad():
        s3, y3, _, _ = triton_ops.add_rms_norm(x, h, w, 1e-5, out_dtype, False)
    torch.testing.assert_close(s3, s, rtol=0, atol=0)
    torch.testing.assert_close(y3, y, rtol=0, atol=0)


def strided_views(width: int) -> list[torch.Tensor]:
    """(3, 5, width) views whose rows are not packed: a slice of wider rows (row stride width + 30),
    and a transpose (its rows reach the kernel as a copy)."""
    wide = leaf(3, 5, width + 30, seed=2)[..., :width]
    turned = leaf(5, 3, width, seed=3).transpose(0, 1)
    return [wide, turned]


@pytest.mark.parametrize("case", ["sliced", "transposed"])
def test_rms_norm_and_swiglu_take_rows_that_are_not_packed(case: str) -> None:
    """The outputs come back contiguous in the input's shape, whatever the input's and the
    gradient's strides, with the torch ops' values."""
    which = ["sliced", "transposed"].index(case)
    x, w = strided_views(100)[which], leaf(100, seed=1)
    grad = strided_views(100)[1 - which].detach()
    y = triton_ops.RMSNorm.apply(x, w, 1e-5, torch.float32, True)
    dx, dw = torch.autograd.grad(y, (x, w), grad)
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    y2 = ref_rms_norm(x2, w2, 1e-5, torch.float32)
    for ours, theirs in zip((y, dx, dw), (y2, *torch.autograd.grad(y2, (x2, w2), grad)), strict=True):
        assert ours.is_contiguous() and ours.shape == theirs.shape
        close(ours, theirs, torch.float32)
    h = strided_views(80)[which]
    y = triton_ops.SwiGLU.apply(h)
    (dh,) = torch.autograd.grad(y, (h,), grad[..., :40])
    h2 = h.detach().requires_grad_()
    gate, up = h2.chunk(2, dim=-1)
    y2 = F.silu(gate) * up
    for ours, theirs in zip((y, dh), (y2, *torch.autograd.grad(y2, (h2,), grad[..., :40])), strict=True):
        assert ours.is_contiguous() and ours.shape == theirs.shape
        close(ours, theirs, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu(dtype: torch.dtype) -> None:
    h = leaf(2, 7, 2 * 40, dtype=dtype)  # 40: not a power of two
    grad = torch.randn(2, 7, 40).to(DEVICE, dtype)
    y = triton_ops.SwiGLU.apply(h)
    (dh,) = torch.autograd.grad(y, (h,), grad)
    h2 = h.detach().float().requires_grad_()
    gate, up = h2.chunk(2, dim=-1)
    y2 = F.silu(gate) * up
    (dh2,) = torch.autograd.grad(y2, (h2,), grad.float())
    assert y.dtype == dtype and dh.dtype == dtype
    close(y, y2, dtype)
    close(dh, dh2, dtype)
    close(triton_ops.swiglu_forward(h.detach()), y2, dtype)


def ref_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, heads, hd) turned by RoPE over its first n_rot dims; cos/sin (T, n_rot)."""
    n_rot = cos.shape[-1]
    half = n_rot // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x[..., :n_rot] * c + rotated * s, rest), dim=-1)


def rope(T: int, n_rot: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, n_rot, 2).float() / n_rot))
    freqs = torch.outer(torch.arange(T).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(DEVICE), emb.sin().to(DEVICE)


@pytest.mark.parametrize("attn_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_rot", [16, 8])  # every dim, and partial rotary
@pytest.mark.parametrize("B, T", [(2, 5), (1, 1), (2, 1)])  # training; one token; a batch of one each
def test_qkv_split_with_rope(attn_dtype: torch.dtype, n_rot: int, B: int, T: int) -> None:
    check_qkv_split(attn_dtype, n_rot, B, T)


@pytest.mark.parametrize("tile", triton_ops.ROPE_TILES.candidates, ids=str)
def test_qkv_split_with_every_tile(tile: Tile) -> None:
    """2 x 37 tokens: with every tile the last program of each head holds fewer tokens than it
    takes."""
    with triton_ops.ROPE_TILES.forced(tile):
        check_qkv_split(torch.bfloat16, 8, 2, 37)


def check_qkv_split(
    attn_dtype: torch.dtype, n_rot: int, B: int, T: int, heads: tuple[int, int, int] = (4, 2, 16)
) -> None:
    H, KV, hd = heads
    qkv = leaf(B, T, H + 2 * KV, hd, dtype=attn_dtype)
    cos, sin = rope(T, n_rot)
    q, k, v = triton_ops.QKV.apply(qkv, cos, sin, (H, KV), attn_dtype)
    assert q.shape == (B, H, T, hd) and k.shape == v.shape == (B, KV, T, hd) and q.is_contiguous()
    grads = [torch.randn(t.shape).to(DEVICE, attn_dtype) for t in (q, k, v)]
    (dqkv,) = torch.autograd.grad((q, k, v), (qkv,), grads)
    x = qkv.detach().float().requires_grad_()
    q2 = ref_rotate(x[:, :, :H], cos, sin).transpose(1, 2)
    k2 = ref_rotate(x[:, :, H : H + KV], cos, sin).transpose(1, 2)
    v2 = x[:, :, H + KV :].transpose(1, 2)
    (dqkv2,) = torch.autograd.grad((q2, k2, v2), (x,), [g.float() for g in grads])
    for ours, theirs in ((q, q2), (k, k2), (v, v2), (dqkv, dqkv2)):
        close(ours, theirs, attn_dtype)
    no_grad = triton_ops.split_qkv(qkv.detach(), (cos, sin), (H, KV), attn_dtype)
    for ours, theirs in zip(no_grad, (q, k, v), strict=True):
        assert ours.is_contiguous()
        close(ours, theirs, attn_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_rows(dtype: torch.dtype) -> None:
    """300 columns read 64 at a time (5 blocks, the last partial), and with the tile an untimed
    launch takes at this width (the smallest that fits the padded row of 512: 256, two blocks)."""
    with triton_ops.CROSS_ENTROPY_TILES.forced(Tile(64, 4, "columns")):
        check_cross_entropy(dtype, vocab=300)
    check_cross_entropy(dtype, vocab=300)


@pytest.mark.parametrize("tile", triton_ops.CROSS_ENTROPY_TILES.candidates, ids=str)
def test_cross_entropy_with_every_tile(tile: Tile) -> None:
    """20,000 columns: from 20 blocks (the last partial) to 2 (the second mostly past the row)."""
    with triton_ops.CROSS_ENTROPY_TILES.forced(tile):
        check_cross_entropy(torch.bfloat16, vocab=20000)


def test_timing_the_cross_entropy_leaves_its_gradient_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timed launch runs every candidate before the real one: they must not write over the logits
    the real launch reads (the gradient goes over them in place). Here every candidate runs (a fake
    clock around the real launch) and the values are still the torch ops'."""
    table = triton_ops.CROSS_ENTROPY_TILES
    ran: list[Tile] = []

    def fake_seconds(launch: Callable[[Tile], None], tile: Tile) -> float:
        launch(tile)
        ran.append(tile)
        return 1.0 if tile.rows != 2048 else 0.5

    monkeypatch.setattr(triton_ops, "worth_timing", lambda *args: True)
    monkeypatch.setattr(table, "seconds", fake_seconds)
    monkeypatch.setattr(table, "chosen", {})
    monkeypatch.setattr(table, "times", {})
    check_cross_entropy(torch.bfloat16, vocab=20000)
    assert ran == list(table.candidates)  # timed once, on the first launch (all fit 32,768 columns)
    assert [tile.rows for tile in table.chosen.values()] == [2048]


def check_cross_entropy(dtype: torch.dtype, vocab: int) -> None:
    rows, scale, last = 6, 0.2, vocab - 50
    logits = (3 * leaf(rows, vocab)).detach().to(dtype)
    logits[1, 10] = logits[1, last] = logits[1].max() + 1  # equal maxima in two blocks: the first wins
    targets = torch.tensor([5, last, -100, 0, vocab - 1, 7], device=DEVICE)  # row 2 ignored
    ref = logits.float().requires_grad_()
    ref_loss = F.cross_entropy(ref, targets, ignore_index=-100, reduction="none")
    (ref_grad,) = torch.autograd.grad(ref_loss.sum() * scale, (ref,))
    argmax = torch.empty(rows, dtype=torch.int64, device=DEVICE)
    grad = logits.clone()  # the gradient written over the logits, as the training step's chunks do
    scale_tensor = torch.tensor(scale, device=DEVICE)
    loss = triton_ops.cross_entropy_rows(grad, targets, -100, scale_tensor, argmax, grad)
    close(loss, ref_loss, torch.float32)  # computed in float32 from the same stored logits
    assert argmax.tolist() == logits.float().argmax(dim=1).tolist() and argmax[1] == 10
    close(grad, ref_grad.to(dtype), dtype)
    assert grad.dtype == dtype and not grad[2].any()  # the ignored row's gradient is 0
    apart = torch.empty_like(logits)  # or into a tensor of its own
    one = torch.ones((), device=DEVICE)
    triton_ops.cross_entropy_rows(logits, targets, -100, one, argmax, apart)
    close(apart, ref_grad.to(dtype) / scale, dtype)
    untouched = logits.clone()  # without the gradient the logits stay as they were
    no_grad = triton_ops.cross_entropy_rows(untouched, targets, -100, one, argmax, None)
    assert torch.equal(untouched, logits) and torch.equal(no_grad, loss)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_takes_the_kernel(reduction: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused loss with the kernel in its chunks (chunks of 3 rows) against the plain ops: loss,
    argmax and both gradients, under bf16 autocast as a CUDA step runs it."""
    from trainer.model import linear_cross_entropy as lce

    monkeypatch.setattr(lce, "triton_kernels_for", lambda *tensors: triton_ops)
    hidden, weight = leaf(10, 32), leaf(300, 32, seed=1)
    targets = torch.tensor([1, 2, -100, 3, 299, 0, 5, -100, 8, 9], device=DEVICE)
    device_type = "cuda" if DEVICE == "cuda" else "cpu"
    with torch.autocast(device_type, dtype=torch.bfloat16):
        loss, argmax = lce.linear_cross_entropy(
            hidden, weight, targets, reduction=reduction, chunk_bytes=3 * 4 * 300
        )
        grads = torch.autograd.grad(loss, (hidden, weight))
        logits = F.linear(hidden, weight).float()
    ref = F.cross_entropy(logits, targets, reduction=reduction)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    close(loss, ref, torch.bfloat16)
    assert torch.equal(argmax, logits.argmax(dim=1))
    for ours, theirs in zip(grads, ref_grads, strict=True):
        close(ours, theirs, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_qkv_writes_the_new_token_into_the_cache(dtype: torch.dtype) -> None:
    """A graphed decoding step's kernel against the torch ops it replaces (fused_ops.decode_qkv on
    CPU tensors): q turned, k turned and v as it is, written at the position; the rest untouched."""
    from trainer.model import fused_ops

    B, H, KV, hd, ctx, n_rot, at = 2, 4, 2, 16, 10, 8, 6  # partial rotary
    qkv = leaf(B, 1, H + 2 * KV, hd, dtype=dtype).detach()
    cos, sin = rope(ctx, n_rot)
    caches = (
        leaf(B, KV, ctx, hd, dtype=dtype, seed=2).detach(),
        leaf(B, KV, ctx, hd, dtype=dtype, seed=3).detach(),
    )
    theirs = caches[0].cpu().clone(), caches[1].cpu().clone()
    before = theirs[0].clone(), theirs[1].clone()
    position = torch.tensor([at], device=DEVICE)
    rows = cos[at : at + 1], sin[at : at + 1]
    q = triton_ops.decode_qkv(qkv, rows, (H, KV), dtype, caches, position)
    q2 = fused_ops.decode_qkv(qkv.cpu(), *(t.cpu() for t in rows), (H, KV), dtype, theirs, position.cpu())
    assert q.shape == (B, H, 1, hd) and q.dtype == dtype
    close(q.cpu(), q2, dtype)
    kept = torch.arange(ctx) != at
    for ours, ref, old in zip((c.cpu() for c in caches), theirs, before, strict=True):
        close(ours, ref, dtype)
        assert torch.equal(ours[:, :, kept], old[:, :, kept]) and not torch.equal(
            ours[:, :, at], old[:, :, at]
        )


def test_a_graphed_decoding_step_with_the_kernels_decodes_as_the_eager_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The graphed decoder's step (run uncaptured) with every kernel it reaches (RMSNorm, decode_qkv,
    SwiGLU) against the eager decoder, in float32: the same logits, step after step."""
    from trainer.config import ModelConfig
    from trainer.model import fused_ops
    from trainer.model.decoders import EagerDecoder, GraphedDecoder
    from trainer.model.llama import Llama

    monkeypatch.setattr(fused_ops, "triton_kernels_for", lambda *tensors: triton_ops)
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ctx=16, vocab_size=97)
    model = Llama(cfg).to(DEVICE).eval()
    logits = []
    for decoder in (EagerDecoder(model), GraphedDecoder(model, capture=False)):
        out = [decoder.prefill([5, 17, 3, 42])]
        for _ in range(8):
            out.append(decoder.step(int(out[-1].argmax())).clone())
        logits.append(torch.stack(out))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


def test_the_model_uses_them_on_cuda_with_the_same_loss() -> None:
    """On a GPU only: a bf16 forward and backward of a small llama through fused_ops with the Triton
    kernels and with torch ops (FROMSCRATCH_TRITON_KERNELS=0) give the same loss and gradients."""
    if DEVICE != "cuda":
        pytest.skip("the model takes the Triton path on CUDA tensors only (the cases above ran here)")
    import os

    from trainer.config import ModelConfig
    from trainer.model import triton_kernels
    from trainer.model.llama import Llama

    cfg = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=128, ctx=64, vocab_size=258)
    torch.manual_seed(0)
    model = Llama(cfg).to(DEVICE)
    idx = torch.randint(0, 258, (4, 64), device=DEVICE)
    results = []
    for switch in ("1", "0"):
        os.environ[triton_kernels.DISABLE_ENV] = switch
        triton_kernels.available.cache_clear()
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, idx, argmax=True)[1]  # argmax: the fused loss (its kernel with Triton)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    os.environ.pop(triton_kernels.DISABLE_ENV)
    triton_kernels.available.cache_clear()
    assert abs(results[0][0] - results[1][0]) < 1e-2
    for ours, theirs in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=5e-2, atol=5e-3)


def test_a_llama_on_the_kernels_computes_what_it_does_on_the_cpu_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On this CPU, in the interpreter: a float32 llama with the model's functions taking the Triton
    kernels, as on CUDA (the residual adds fused into the norms after them among them, and the
    fused loss's kernel), against the CPU path: the loss, every gradient, and logits without one."""
    if DEVICE == "cuda":
        pytest.skip("on CUDA, test_the_model_uses_them_on_cuda_with_the_same_loss compares the two paths")
    from trainer.config import ModelConfig
    from trainer.config.fused_loss import ENV as FUSED_LOSS
    from trainer.model import fused_ops, linear_cross_entropy
    from trainer.model.llama import Llama

    monkeypatch.setenv(FUSED_LOSS, "1")  # the loss fused on both paths, as on CUDA
    torch.manual_seed(0)
    model = Llama(ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ctx=32, vocab_size=258))
    idx = torch.randint(0, 258, (2, 32))

    def run() -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        model.zero_grad()
        loss = model(idx, idx, argmax=True)[1]
        assert loss is not None
        loss.backward()
        with torch.no_grad():
            logits = model(idx)[0]
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], logits

    cpu_path = run()
    fused: list[str] = []
    for module in (fused_ops, linear_cross_entropy):
        monkeypatch.setattr(module, "triton_kernels_for", lambda *tensors: triton_ops)
    apply = triton_ops.AddRMSNorm.apply
    monkeypatch.setattr(triton_ops.AddRMSNorm, "apply", lambda *a: fused.append("add") or apply(*a))
    kernels = run()
    # in the training forward, every norm but the first block's first adds the residual branch before it
    assert fused == ["add"] * 4
    close(kernels[0], cpu_path[0], torch.float32)
    assert len(kernels[1]) == len(cpu_path[1]) == len(list(model.parameters()))
    for ours, theirs in zip(kernels[1], cpu_path[1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    close(kernels[2], cpu_path[2], torch.float32)


def test_a_big_training_launch_times_its_tiles_on_cuda() -> None:
    """On a GPU only: a training launch of a big shape times the candidates and keeps the fastest
    (its values still right); the same shape without gradients (decoding, evaluation) is not timed."""
    if DEVICE != "cuda":
        pytest.skip("tiles are timed on CUDA only (each tile's values are checked above)")
    B, T, H, KV, hd = 4, 1024, 8, 4, 64  # 4096 tokens x 8 heads x 64: 2M values in q
    rope_tiles, rms_tiles = triton_ops.ROPE_TILES, triton_ops.RMS_BACKWARD_TILES
    rope_key_count, rms_key_count = len(rope_tiles.chosen), len(rms_tiles.chosen)
    qkv = leaf(B, T, H + 2 * KV, hd, dtype=torch.bfloat16)
    with torch.no_grad():
        triton_ops.split_qkv(qkv, rope(T, hd), (H, KV), torch.bfloat16)
    assert len(rope_tiles.chosen) == rope_key_count
    check_qkv_split(torch.bfloat16, hd, B, T, heads=(H, KV, hd))
    assert len(rope_tiles.chosen) > rope_key_count
    assert all(len(times) > 1 for times in rope_tiles.times.values())
    forward_key_count = len(triton_ops.RMS_FORWARD_TILES.chosen)
    check_rms_norm(torch.bfloat16, 512, rows=(B, T))  # 2M values
    assert len(rms_tiles.chosen) == rms_key_count + 1
    assert len(triton_ops.RMS_FORWARD_TILES.chosen) == forward_key_count + 1
    loss_tiles = triton_ops.CROSS_ENTROPY_TILES
    loss_key_count = len(loss_tiles.chosen)
    check_cross_entropy(torch.bfloat16, vocab=20000)  # 120k values: not timed
    assert len(loss_tiles.chosen) == loss_key_count
    logits = (3 * torch.randn(64, 32768, device=DEVICE)).to(torch.bfloat16)  # 2M values
    targets = torch.randint(0, 32768, (64,), device=DEVICE)
    argmax, grad = torch.empty(64, dtype=torch.int64, device=DEVICE), logits.clone()
    loss = triton_ops.cross_entropy_rows(grad, targets, -100, torch.ones((), device=DEVICE), argmax, grad)
    assert len(loss_tiles.chosen) == loss_key_count + 1  # timed, and the values still right
    ref = logits.float().requires_grad_()
    ref_loss = F.cross_entropy(ref, targets, reduction="none")
    close(loss, ref_loss, torch.float32)
    close(grad, torch.autograd.grad(ref_loss.sum(), (ref,))[0].to(torch.bfloat16), torch.bfloat16)
