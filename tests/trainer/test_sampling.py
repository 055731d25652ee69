"""Sampling: KV-cached greedy decoding equals a plain argmax loop; seeds, top-k/top-p, EOS, long outputs;
stream_ids yields the same tokens one at a time."""

from __future__ import annotations

import pytest
import torch

from trainer.model.llama import Llama
from trainer.sampling import Penalties, complete, generate, generate_ids, sample_next, stream_ids


@pytest.fixture
def model(tiny_model):
    torch.manual_seed(0)
    m = Llama(tiny_model(n_layer=2, n_head=4, n_kv_head=2, ctx=16))
    # sharpen the random init so greedy paths are not decided by float noise
    with torch.no_grad():
        m.output.weight.mul_(20)
    return m.eval()


def argmax_loop(model: Llama, ids: list[int], n: int) -> list[int]:
    """Reference: full forward pass over the whole sequence for every new token, no cache."""
    seq = list(ids)
    for _ in range(n):
        logits, _ = model(torch.tensor([seq]))
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(ids) :]


def test_greedy_with_cache_equals_argmax_without(model):
    prompt = [5, 17, 99, 3]
    assert generate_ids(model, prompt, max_new_tokens=12, temperature=0) == argmax_loop(model, prompt, 12)


def test_generates_past_the_context(model):
    out = generate_ids(model, [1, 2, 3], max_new_tokens=50, temperature=0)
    assert len(out) == 50
    # up to the first re-prefill (cache full at ctx=16) it matches the uncached loop exactly
    assert out[:13] == argmax_loop(model, [1, 2, 3], 13)
    # a prompt longer than the context is cut to its last tokens
    assert len(generate_ids(model, list(range(40)), max_new_tokens=5, temperature=0.7, seed=1)) == 5


def test_seed_makes_sampling_reproducible(model):
    a = generate_ids(model, [7], max_new_tokens=20, temperature=1.0, seed=123)
    b = generate_ids(model, [7], max_new_tokens=20, temperature=1.0, seed=123)
    assert a == b
    others = {tuple(generate_ids(model, [7], max_new_tokens=20, temperature=1.5, seed=s)) for s in range(5)}
    assert len(others) > 1


def test_top_k_one_and_tiny_top_p_are_greedy(model):
    greedy = generate_ids(model, [9, 8], max_new_tokens=10, temperature=0)
    assert generate_ids(model, [9, 8], max_new_tokens=10, temperature=1.0, top_k=1, seed=0) == greedy
    assert generate_ids(model, [9, 8], max_new_tokens=10, temperature=1.0, top_p=1e-6, seed=0) == greedy


def test_sample_next_respects_top_k_and_top_p():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    assert {sample_next(logits, 1.0, 2, None, gen) for _ in range(200)} == {0, 1}
    probs = torch.softmax(logits, 0)  # ~[0.64, 0.23, 0.09, ...]: top_p 0.8 keeps the first two
    assert probs[0] < 0.8 < probs[0] + probs[1]
    assert {sample_next(logits, 1.0, None, 0.8, gen) for _ in range(200)} == {0, 1}


def test_stops_at_eos(model):
    first = generate_ids(model, [4, 5], max_new_tokens=5, temperature=0)[0]
    assert generate_ids(model, [4, 5], max_new_tokens=5, temperature=0, eos_id=first) == []


def test_generate_text_with_tokenizer(model, byte_tokenizer):
    text = generate(model, byte_tokenizer, "Hi", max_new_tokens=8, temperature=0)
    ids = argmax_loop(model, byte_tokenizer.encode("Hi"), 8)
    cut = ids.index(byte_tokenizer.eos_id) if byte_tokenizer.eos_id in ids else len(ids)
    assert text == byte_tokenizer.decode(ids[:cut])
    assert isinstance(generate(model, byte_tokenizer, "", max_new_tokens=4, seed=0), str)  # BOS start
    assert model.training is False


def test_extreme_temperature_and_top_p_never_give_inf_or_nan(model):
    """A temperature of 1e-40 or a top_p of 5e-324 (both accepted by the API's bounds) overflowed
    float32 into an inf/nan distribution; both now mean greedy, and so do the whole generations."""
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    gen = torch.Generator().manual_seed(0)
    for temperature in (1e-40, 5e-324, 1e-4):
        assert {sample_next(logits, temperature, None, None, gen) for _ in range(20)} == {1}
    for top_p in (5e-324, 1e-45, 1e-300):
        assert {sample_next(logits, 1.0, None, top_p, gen) for _ in range(20)} == {1}
    assert {sample_next(logits, 1e-40, 2, 5e-324, gen) for _ in range(5)} == {1}
    # logits that are already inf/nan (a broken model) still give a token, not an error
    assert sample_next(torch.tensor([float("nan"), 1.0, float("inf")]), 1.0, None, None, gen) == 2

    greedy = generate_ids(model, [3, 1], max_new_tokens=8, temperature=0)
    assert generate_ids(model, [3, 1], max_new_tokens=8, temperature=1e-40, seed=1) == greedy
    assert generate_ids(model, [3, 1], max_new_tokens=8, temperature=1.0, top_p=5e-324, seed=1) == greedy


def test_any_64_bit_seed_is_accepted(model):
    """The API takes seeds in [-2**63, 2**64): torch's generator must too."""
    for seed in (-(2**63), -1, 2**63, 2**64 - 1):
        assert len(generate_ids(model, [2], max_new_tokens=3, temperature=1.0, seed=seed)) == 3


def test_complete_counts_the_tokens_generated(model, byte_tokenizer):
    """usage.completion_tokens is the number of tokens sampled. Encoding the decoded text again
    counts something else: a byte that is not valid UTF-8 on its own decodes to U+FFFD."""
    recounted_differs = False
    for seed in range(10):
        out = complete(model, byte_tokenizer, "Hi", max_new_tokens=30, temperature=1.5, seed=seed)
        ids = generate_ids(
            model,
            byte_tokenizer.encode("Hi"),
            30,
            temperature=1.5,
            seed=seed,
            eos_id=byte_tokenizer.eos_id,
        )
        assert out.completion_tokens == len(ids) and out.text == byte_tokenizer.decode(ids)
        assert out.prompt_tokens == len(byte_tokenizer.encode("Hi"))
        recounted_differs |= len(byte_tokenizer.encode(out.text)) != out.completion_tokens
    assert recounted_differs, "no sample had a lone byte: the test no longer shows the miscount"
    assert complete(model, byte_tokenizer, "", max_new_tokens=4, temperature=0).prompt_tokens == 0


def test_stream_ids_yields_the_tokens_of_generate_ids_one_by_one(model):
    """One decoding loop: generate_ids collects stream_ids, so a streamed completion is the same
    tokens (past a context shift too); closing the stream early stops decoding."""
    for kwargs in ({"temperature": 0}, {"temperature": 1.2, "seed": 4, "top_k": 50}):
        whole = generate_ids(model, [3, 4], max_new_tokens=40, **kwargs)
        stream = stream_ids(model, [3, 4], max_new_tokens=40, **kwargs)
        assert next(stream) == whole[0]
        assert [whole[0], *stream] == whole
    first = generate_ids(model, [4, 5], max_new_tokens=3, temperature=0)
    assert list(stream_ids(model, [4, 5], 3, temperature=0, eos_id=first[1])) == first[:1]
    stream = stream_ids(model, [1], 1000, temperature=1.0, seed=0)
    taken = [next(stream) for _ in range(3)]
    stream.close()
    assert list(stream) == [] and len(taken) == 3


def penalized_argmax_loop(model: Llama, ids: list[int], n: int, penalties: Penalties) -> list[int]:
    """Reference for OpenAI's penalties: the uncached argmax loop, each token's logits adjusted by
    the counts of the tokens generated before it."""
    seq, counts = list(ids), torch.zeros(model.cfg.vocab_size)
    for _ in range(n):
        logits, _ = model(torch.tensor([seq]))
        adjusted = logits[0, -1] - penalties.frequency * counts - penalties.presence * (counts > 0).float()
        for token, bias in penalties.logit_bias.items():
            adjusted[token] += bias
        seq.append(int(adjusted.argmax()))
        counts[seq[-1]] += 1
    return seq[len(ids) :]


@pytest.mark.parametrize(
    "penalties",
    [
        Penalties(frequency=1.5),
        Penalties(presence=2.0),
        Penalties(frequency=0.5, presence=0.5, logit_bias={7: 3.0}),
    ],
)
def test_penalties_adjust_each_tokens_logits_by_what_was_generated(model, penalties):
    prompt = [5, 17, 99, 3]
    plain = generate_ids(model, prompt, max_new_tokens=12, temperature=0)
    got = list(stream_ids(model, prompt, 12, temperature=0, penalties=penalties))
    assert got == penalized_argmax_loop(model, prompt, 12, penalties) != plain


def test_logit_bias_forces_or_bans_a_token_and_presence_forbids_repeats(model):
    prompt = [5, 17, 99, 3]
    plain = generate_ids(model, prompt, max_new_tokens=12, temperature=0)
    forced = stream_ids(
        model, prompt, 12, temperature=0.9, seed=1, penalties=Penalties(logit_bias={42: 100.0})
    )
    assert set(forced) == {42}
    banned = list(
        stream_ids(model, prompt, 12, temperature=0, penalties=Penalties(logit_bias={plain[0]: -100.0}))
    )
    assert plain[0] not in banned
    distinct = list(stream_ids(model, prompt, 40, temperature=0, penalties=Penalties(presence=1e4)))
    assert len(set(distinct)) == len(distinct) == 40
    with pytest.raises(ValueError, match="logit_bias"):
        next(stream_ids(model, prompt, 4, penalties=Penalties(logit_bias={model.cfg.vocab_size: 1.0})))


def test_the_room_a_reply_has_is_what_the_kept_prompt_leaves() -> None:
    from trainer.sampling import context_room

    assert [context_room(n, 128) for n in (0, 100, 127)] == [128, 28, 1]
    # a prompt that fills the context is cut to its last ctx/2 tokens: the reply has the other half
    assert [context_room(n, 128) for n in (128, 500)] == [64, 64]
    assert context_room(5, 1) == 1
