"""The trainer on CUDA (`pytest -m cuda`; skipped, saying why, on a machine without a GPU).

What the CPU suite cannot check: bf16 autocast, fused AdamW, TF32 matmuls, SDPA's flash kernel and
torch.compile on a GPU; an exact resume on CUDA (pause, resume, equal to the straight run within
bf16's noise); and the exports of a CUDA-trained checkpoint read by their real consumers
(transformers, onnxruntime, llama.cpp), compared with our model's logits on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.trainer.conftest import read_metrics, train_losses
from tests.trainer.test_resume import StopAfter, tensors
from trainer.checkpoint import load_checkpoint
from trainer.config import ModelConfig, TrainConfig
from trainer.export import export
from trainer.model.llama import Llama
from trainer.optim.optimizers import make_optimizer
from trainer.run.loop import train
from trainer.run.report import Callbacks
from trainer.run.state import StartInfo

pytestmark = pytest.mark.cuda(devices=1)

# head_dim 64, ctx 128: a shape SDPA's flash kernel takes
MODEL = dict(n_layer=2, n_head=2, n_embd=128, ctx=128)


# the CPU tests' tiny_train, on CUDA, with more steps, larger batches and evaluations
# (dtype auto: the CPU fixture pins float32, and auto on CUDA is what the first test checks)
CUDA_RUN: dict[str, Any] = dict(
    device="cuda", max_steps=40, batch_size=8, warmup_steps=4, eval_every=20, eval_batches=4, dtype="auto"
)


@pytest.fixture
def cuda_train(tiny_train: Callable[..., TrainConfig]) -> Callable[..., TrainConfig]:
    return lambda **kw: tiny_train(**{**CUDA_RUN, **kw})


class RecordStart(Callbacks):
    def __init__(self) -> None:
        self.info: StartInfo | None = None

    def on_start(self, info: StartInfo) -> None:
        self.info = info


def test_auto_precision_trains_in_bf16_with_fused_adamw_and_tf32(
    tmp_path, shakespeare_data, byte_tokenizer, cuda_train
):
    seen = RecordStart()
    result = train(
        ModelConfig(**MODEL), cuda_train(), shakespeare_data, tmp_path, seen, tokenizer=byte_tokenizer
    )
    assert seen.info is not None
    assert seen.info["device"].startswith("cuda") and seen.info["dtype"] == "bfloat16"
    assert seen.info["dtype_reason"] == "auto: the CUDA device supports bfloat16"
    assert torch.get_float32_matmul_precision() == "high"  # TF32 for what stays in float32
    losses = train_losses(tmp_path)
    assert result.stop_reason == "completed" and all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0], losses  # it learns
    assert result.last_val_loss is not None and result.last_val_loss < 3.5

    optimizer = make_optimizer(Llama(ModelConfig(**MODEL)).cuda(), cuda_train())
    assert optimizer.defaults["fused"] is True


def test_attention_runs_the_flash_kernel_in_bf16():
    from torch.profiler import ProfilerActivity, profile

    model = Llama(ModelConfig(**MODEL)).cuda()
    x = torch.randint(0, 258, (4, MODEL["ctx"]), device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        torch.cuda.synchronize()
    kernels = [e.key for e in prof.key_averages()]
    assert any("flash" in k.lower() for k in kernels), kernels


def test_compiled_training_matches_eager_on_cuda(tmp_path, shakespeare_data, byte_tokenizer, cuda_train):
    cfg = dict(max_steps=12, eval_every=0, dtype="bfloat16")
    eager = train(
        ModelConfig(**MODEL),
        cuda_train(compile=False, **cfg),
        shakespeare_data,
        tmp_path / "eager",
        tokenizer=byte_tokenizer,
    )
    seen = RecordStart()
    compiled = train(
        ModelConfig(**MODEL),
        cuda_train(compile=True, **cfg),
        shakespeare_data,
        tmp_path / "compiled",
        seen,
        tokenizer=byte_tokenizer,
    )
    assert seen.info is not None and seen.info["compile"] is True
    assert eager.stop_reason == compiled.stop_reason == "completed"
    # inductor fuses and reorders bf16 arithmetic: the same curve within bf16's rounding
    a, b = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    print("eager", a, "\ncompiled", b)
    np.testing.assert_allclose(b, a, rtol=2e-2)


def test_pause_and_resume_on_cuda_continues_the_straight_run(
    tmp_path, shakespeare_data, byte_tokenizer, cuda_train
):
    cfg = cuda_train(max_steps=16, eval_every=8, dtype="bfloat16")
    model = ModelConfig(**MODEL)
    straight = train(model, cfg, shakespeare_data, tmp_path / "straight", tokenizer=byte_tokenizer)
    first = train(model, cfg, shakespeare_data, tmp_path / "resumed", StopAfter(8), tokenizer=byte_tokenizer)
    assert first.stop_reason == "pause" and first.step == 8
    second = train(model, cfg, shakespeare_data, tmp_path / "resumed", tokenizer=byte_tokenizer, resume=True)
    assert second.stop_reason == "completed" and second.step == 16
    assert second.tokens_seen == straight.tokens_seen

    a, b = train_losses(tmp_path / "straight"), train_losses(tmp_path / "resumed")
    steps = [m["step"] for m in read_metrics(tmp_path / "resumed") if "train_loss" in m]
    assert steps == list(range(1, 17))  # no step twice, none skipped
    ta = tensors(tmp_path / "straight" / "final", "model.safetensors")
    tb = tensors(tmp_path / "resumed" / "final", "model.safetensors")
    weight_gap = max((ta[k] - tb[k]).abs().max().item() for k in ta)
    print(f"max loss gap {np.abs(np.array(a) - np.array(b)).max():.3g}, max weight gap {weight_gap:.3g}")
    np.testing.assert_allclose(b, a, rtol=1e-2)  # bf16 autocast: equal within its rounding
    assert weight_gap < 1e-2


@torch.no_grad()
def cpu_logits(ckpt: Path, ids: list[list[int]]) -> np.ndarray:
    """Our model's float32 logits on the CPU, from the CUDA-trained checkpoint."""
    c = load_checkpoint(ckpt)
    model = Llama(c.model_config)
    model.load_state_dict(c.model_state)
    return model.eval()(torch.tensor(ids))[0].numpy()


TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east"


@pytest.fixture(scope="module")
def cuda_checkpoint(
    tmp_path_factory, shakespeare_data, byte_tokenizer
) -> tuple[Path, list[list[int]], np.ndarray]:
    """A bf16 CUDA-trained checkpoint (trained once for the consumer tests), the test text's ids and
    our float32 CPU logits of them."""
    run = tmp_path_factory.mktemp("cuda-export") / "run"
    overrides = dict(max_steps=60, learning_rate=3e-3, checkpoint_every=0, dtype="bfloat16")
    config = TrainConfig(**{**CUDA_RUN, **overrides})
    result = train(ModelConfig(**MODEL), config, shakespeare_data, run, tokenizer=byte_tokenizer)
    assert result.final_checkpoint is not None
    ids = [byte_tokenizer.encode(TEXT)]
    return result.final_checkpoint, ids, cpu_logits(result.final_checkpoint, ids)


def test_the_hf_export_of_a_cuda_checkpoint_gives_our_logits_in_transformers(tmp_path, cuda_checkpoint):
    from transformers import AutoModelForCausalLM

    ckpt, ids, ours = cuda_checkpoint
    hf = AutoModelForCausalLM.from_pretrained(export(ckpt, "hf", tmp_path / "hf"), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf.eval()(torch.tensor(ids)).logits.numpy()
    assert np.abs(theirs - ours).max() <= 1e-3


def test_the_onnx_export_of_a_cuda_checkpoint_gives_our_logits_in_onnxruntime(tmp_path, cuda_checkpoint):
    import onnxruntime

    ckpt, ids, ours = cuda_checkpoint
    session = onnxruntime.InferenceSession(
        str(export(ckpt, "onnx", tmp_path / "model.onnx")), providers=["CPUExecutionProvider"]
    )
    (theirs,) = session.run(["logits"], {"input_ids": np.array(ids, dtype=np.int64)})
    assert np.abs(theirs - ours).max() <= 1e-3


def test_the_gguf_export_of_a_cuda_checkpoint_gives_our_logits_in_llama_cpp(tmp_path, cuda_checkpoint):
    import llama_cpp  # the real consumer, never skipped

    ckpt, ids, ours = cuda_checkpoint
    llm = llama_cpp.Llama(
        str(export(ckpt, "gguf", tmp_path / "model.gguf")),
        n_ctx=MODEL["ctx"],
        logits_all=True,
        verbose=False,
        n_threads=1,
        type_k=0,  # f32 KV cache: the f16 default alone moves logits by ~1e-2
        type_v=0,
    )
    assert llm.tokenize(TEXT.encode(), add_bos=False, special=False) == ids[0]
    llm.eval(ids[0])
    assert np.abs(np.array(llm.scores[: len(ids[0])]) - ours[0]).max() <= 1e-3
