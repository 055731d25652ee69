"""An inference worker on CUDA (issue 23; `pytest -m cuda`): worker.inference_device puts the weights
on the GPU in bfloat16, the logits stay within bfloat16's rounding of the CPU's float32 ones, and
decoding runs there, its KV cache on the device (trainer.sampling builds it from the weights)."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.data.tokenizers import ByteTokenizer
from trainer.model.llama import Llama
from trainer.sampling import generate_ids
from worker.inference_device import InferenceDevice

pytestmark = pytest.mark.cuda(devices=1)


def test_on_cuda_the_weights_are_bfloat16_and_decode_on_the_device() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=64, ctx=64, vocab_size=258)
    cpu_model = InferenceDevice("cpu").place(Llama(cfg))
    gpu = InferenceDevice("cuda")
    gpu_model = gpu.place(Llama(cfg))
    gpu_model.load_state_dict(cpu_model.state_dict())
    assert {p.dtype for p in gpu_model.parameters()} == {gpu.dtype} and next(gpu_model.parameters()).is_cuda
    prompt = list(ByteTokenizer().encode("To be or not"))
    with torch.no_grad():
        want, _ = cpu_model(torch.tensor([prompt]))
        got, _ = gpu_model(torch.tensor([prompt], device="cuda"))
    torch.testing.assert_close(got.float().cpu(), want, atol=0.05, rtol=0.05)  # bf16's rounding
    new = generate_ids(gpu_model, prompt, 24, temperature=0.8, seed=1)  # its KV cache on the GPU
    assert len(new) == 24 and all(0 <= t < cfg.vocab_size for t in new)
