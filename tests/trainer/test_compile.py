"""torch.compile of the model: the hand-written autograd functions of the eager path (RMSNorm,
q/k/v + RoPE, SwiGLU: trainer/model/llama.py) step aside while compiling, so inductor traces plain ops,
and the compiled model computes the eager model's loss and gradients."""

from __future__ import annotations

import torch

from trainer.config import ModelConfig
from trainer.model.llama import Llama


def test_compiled_model_matches_eager_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = Llama(ModelConfig(n_layer=1, n_head=4, n_kv_head=2, n_embd=32, ctx=16, vocab_size=50))
    compiled = torch.compile(model)
    x, y = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))

    _, eager_loss = model(x, y)
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    _, loss = compiled(x, y)
    loss.backward()

    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for p, g in zip(model.parameters(), eager_grads, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # evaluation through the compiled model too
        torch.testing.assert_close(compiled(x)[0], model(x)[0], rtol=1e-5, atol=1e-5)


def test_regionally_compiled_blocks_compile_once_for_every_layer_and_match_eager() -> None:
    """Regional compilation (trainer.run.state: each block's Module.compile()) pays one compile for
    all layers only while every layer is called with the same kinds of arguments: an eager block
    hands its feed-forward output to the next (`pending`), a compiled one adds its own."""
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    model = Llama(ModelConfig(n_layer=3, n_head=4, n_kv_head=2, n_embd=32, ctx=16, vocab_size=50))
    x, y = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    _, eager_loss = model(x, y)
    counter = CompileCounter()
    torch._dynamo.reset()
    for block in model.layers:
        block.compile(backend=counter)
    _, loss = model(x, y)
    assert counter.frame_count == 1
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
