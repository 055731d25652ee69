"""trainer.model.decoders (issue 23, GPU inference): the graphed decoder's step (a KV cache at fixed
addresses, the position held on the device, a mask over the rest) computes what the eager decoder
does, also after the context fills and the prompt is prefilled again over older keys; the pool hands
each concurrent request its own decoder and reuses them, follows weights changed in place (the packed
projections are copied again) and lets go of a model nobody else holds. Captured as a CUDA graph: test_cuda_decoding.py."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.config import ModelConfig
from trainer.model.decoders import DecoderPool, EagerDecoder, GraphedDecoder, graphs_enabled
from trainer.model.llama import Llama
from trainer.optim.adamw import AdamW
from trainer.sampling import decode, sample_token


@pytest.fixture
def model() -> Llama:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ctx=16, vocab_size=97)
    return Llama(cfg).eval()


def decode_greedily(
    decoder: EagerDecoder | GraphedDecoder, prompt: list[int], steps: int
) -> list[torch.Tensor]:
    """Greedy decoding that prefills the last ctx/2 tokens again whenever the context is full."""
    ctx = decoder.model.cfg.ctx
    tokens, out = list(prompt), [decoder.prefill(prompt)]
    for _ in range(steps):
        tokens.append(int(out[-1].argmax()))
        if decoder.position >= ctx:
            out.append(decoder.prefill(tokens[-(ctx // 2) :]))
        else:
            out.append(decoder.step(tokens[-1]).clone())
    return out


def test_the_graphed_step_computes_what_the_eager_decoder_does(model: Llama) -> None:
    prompt = [5, 17, 3, 42, 8, 1, 60]
    # 30 steps in a context of 16: two refills, each leaving stale keys past the new position
    want = decode_greedily(EagerDecoder(model), prompt, 30)
    got = decode_greedily(GraphedDecoder(model, capture=False), prompt, 30)
    assert len(got) == len(want) == 31
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_stale_keys_past_the_position_are_masked(model: Llama) -> None:
    decoder = GraphedDecoder(model, capture=False)
    decoder.prefill(list(range(1, 16)))  # 15 positions filled
    short = decoder.prefill([4, 9])  # the same buffers, 13 stale positions past 2
    fresh = EagerDecoder(model)
    torch.testing.assert_close(short, fresh.prefill([4, 9]))
    torch.testing.assert_close(decoder.step(7), fresh.step(7), atol=1e-5, rtol=1e-5)
    assert decoder.position == fresh.position == 3


def test_a_full_context_is_refused_rather_than_written_past(model: Llama) -> None:
    decoder = GraphedDecoder(model, capture=False)
    decoder.prefill(list(range(16)))
    with pytest.raises(ValueError, match="context of 16 tokens is full"):
        decoder.step(1)


def test_the_pool_gives_concurrent_requests_their_own_decoders_and_reuses_them(model: Llama) -> None:
    pool = DecoderPool()
    taken: list[GraphedDecoder] = []
    both_in = threading.Barrier(2)

    def request() -> None:
        with pool.take(model, capture=False) as decoder:
            taken.append(decoder)
            both_in.wait(timeout=30)  # each holds its decoder while the other takes one

    threads = [threading.Thread(target=request) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(d) for d in taken}) == 2 and pool.idle_count(model) == 2
    with pool.take(model, capture=False) as again:
        assert any(again is d for d in taken) and pool.idle_count(model) == 1


def test_the_pool_drops_decoders_of_a_model_cast_since(model: Llama) -> None:
    pool = DecoderPool()
    with pool.take(model, capture=False):
        pass
    model.to(torch.float64)
    with pool.take(model, capture=False) as decoder:
        assert decoder.cache.k[0].dtype == torch.float64
    assert pool.idle_count(model) == 1


def test_graphs_only_for_a_cuda_model_in_eval_mode(model: Llama, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not graphs_enabled(model)  # the CPU keeps its eager path
    if torch.cuda.is_available():
        cuda_model = Llama(model.cfg).cuda().eval()
        assert graphs_enabled(cuda_model)
        assert not graphs_enabled(cuda_model.train())
        monkeypatch.setenv("FROMSCRATCH_CUDA_GRAPHS", "0")
        assert not graphs_enabled(cuda_model.eval())


def _train_one_step(model: Llama) -> None:
    # the trainer's AdamW: torch's fused kernel, which writes the weights without bumping their
    # version counters (a refresh that waited for those missed this update)
    opt = AdamW(model.optimizer_groups(0.1), lr=0.05, betas=(0.9, 0.95), eps=1e-8)
    x = torch.randint(0, model.cfg.vocab_size, (2, 8))
    _, loss = model.train()(x, targets=x)
    assert loss is not None
    loss.backward()
    opt.step()
    model.eval()


def _load_other_weights(model: Llama) -> None:
    torch.manual_seed(1)
    model.load_state_dict(Llama(model.cfg).state_dict())


@pytest.mark.parametrize("change", [_train_one_step, _load_other_weights])
def test_pooled_decoders_follow_weights_changed_in_place(
    model: Llama, change: Callable[[Llama], None]
) -> None:
    pool, prompt = DecoderPool(), [5, 17, 3, 42]
    with pool.take(model, capture=False) as decoder:
        decoder.prefill(prompt)
        before = decoder.step(8).clone()
    change(model)  # as sampling between training steps, or a reload, would find it
    with pool.take(model, capture=False) as decoder:
        decoder.prefill(prompt)
        after = decoder.step(8)
    eager = EagerDecoder(model)
    eager.prefill(prompt)
    want = eager.step(8)
    assert not torch.allclose(before, want, atol=1e-3)  # the change does change the logits
    torch.testing.assert_close(after, want, atol=1e-5, rtol=1e-5)


def test_the_pool_lets_go_of_a_model_nobody_else_holds() -> None:
    pool = DecoderPool()
    model = Llama(ModelConfig(n_layer=1, n_head=2, n_embd=32, ctx=8, vocab_size=50)).eval()
    with pool.take(model, capture=False) as decoder:
        decoder.prefill([1, 2])
        decoder.step(3)
    assert pool.idle_count(model) == 1
    gone = weakref.ref(model)
    del model, decoder
    gc.collect()
    assert gone() is None  # the idle decoder and its packed weights held it


class _DispatchedOps(TorchDispatchMode):
    """The aten ops a block of code dispatches (each that computes is a kernel in a CUDA graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_graphed_step_copies_no_weights_and_converts_no_mask(model: Llama) -> None:
    decoder = GraphedDecoder(model, capture=False)
    decoder.prefill([1, 2, 3])
    with _DispatchedOps() as ops:
        decoder.step(4)
    # per layer, concatenating the projections copied them (two cats) and SDPA turned a boolean mask
    # into an additive one (scalar tensors and a where): five kernels a layer in the graph
    assert ops.names.count("aten.mm.default") == 9  # 4 matmuls a layer, 2 layers, the output
    for copying in ("aten.cat.default", "aten.where.self", "aten.scalar_tensor.default"):
        assert copying not in ops.names


def _sampled(decoder: EagerDecoder | GraphedDecoder, n: int, eos_id: int | None = None) -> list[int]:
    generator = torch.Generator().manual_seed(3)

    def pick(logits: torch.Tensor) -> torch.Tensor:
        return sample_token(logits, 0.9, None, None, generator)

    return list(decode(decoder, [5, 17, 3], n, pick, eos_id))


def test_decoding_ahead_samples_what_decoding_in_turn_does(model: Llama) -> None:
    # the graphed decoder is handed each token on the device and stepped before it is read back;
    # 40 tokens in a context of 16 refill it (in turn) between stretches decoded ahead
    assert GraphedDecoder.queues_ahead and not EagerDecoder.queues_ahead
    want = _sampled(EagerDecoder(model), 40)
    assert _sampled(GraphedDecoder(model, capture=False), 40) == want
    eos = want[6]
    stopped = _sampled(GraphedDecoder(model, capture=False), 40, eos_id=eos)
    assert stopped == want[: want.index(eos)]
