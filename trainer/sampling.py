"""Autoregressive sampling with a KV cache.

When the context fills up, the cache is rebuilt from the last ctx//2 tokens (one prefill) and
decoding continues; this costs one prefill per ctx/2 new tokens instead of one per token.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from trainer.logprobs import LogprobRecorder
from trainer.model.decoders import Decoder, decoder_for
from trainer.model.llama import Llama

if TYPE_CHECKING:
    from trainer.data.tokenizers import Tokenizer


# Below this temperature sampling is greedy: dividing logits by a tinier one overflows float32
# (1e-40 makes them inf, and softmax then nan), and the distribution is already one-hot.
MIN_TEMPERATURE = 1e-3


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> int:
    """One token id from a (vocab,) logits vector. A temperature under MIN_TEMPERATURE (0 too)
    means greedy (argmax), and so does a top_p too small to keep more than the first token."""
    return int(sample_token(logits, temperature, top_k, top_p, generator))


def sample_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """sample_next's token as a tensor on the logits' device, nothing waited for (on CUDA the next
    decoding step can be queued behind it before it is read back)."""
    if temperature < MIN_TEMPERATURE:
        return torch.argmax(logits)
    logits = logits.float() / temperature
    if top_k is not None and 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and 0 < top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        # drop a token when the tokens ranked above it already reach top_p; the first always stays
        # (compared in float32, a top_p of 5e-324 is 0.0, which the first token's 0.0 would reach)
        drop = (torch.cumsum(sorted_probs, 0) - sorted_probs) >= top_p
        drop[0] = False
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        probs = probs / probs.sum()
    # Logits that were inf/nan already give no distribution: the argmax of the rest instead, chosen
    # on the device. Checking on the host first would make a CUDA decoding step wait twice per token
    # (once before multinomial could be launched, once for its result); this way it waits once.
    finite = torch.isfinite(probs).all()
    greedy = torch.nan_to_num(logits, nan=float("-inf")).argmax()
    probs = torch.where(finite, probs, F.one_hot(greedy, probs.numel()).to(probs.dtype))
    return torch.multinomial(probs, 1, generator=generator)


@dataclass(frozen=True)
class Penalties:
    """OpenAI's frequency_penalty, presence_penalty and logit_bias: before each token is picked,
    logits[j] += logit_bias[j] - frequency * count[j] - presence * (count[j] > 0), where count[j] is
    how often token j was generated so far (the prompt's tokens are not counted)."""

    frequency: float = 0.0
    presence: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.frequency or self.presence or self.logit_bias)

    def picker(
        self, pick: Callable[[torch.Tensor], torch.Tensor], vocab_size: int, device: torch.device
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """`pick` on the adjusted logits, counting what it picks (on the device: nothing waited for)."""
        if any(not 0 <= token < vocab_size for token in self.logit_bias):
            raise ValueError(f"logit_bias: token ids must be in 0..{vocab_size - 1}")
        counts = torch.zeros(vocab_size, device=device)
        bias = torch.zeros(vocab_size, device=device)
        if self.logit_bias:
            ids, values = zip(*self.logit_bias.items(), strict=True)
            bias[list(ids)] = torch.tensor(values, device=device)
        one = torch.ones(1, device=device)

        def penalized(logits: torch.Tensor) -> torch.Tensor:
            adjusted = logits.float() + bias - self.frequency * counts - self.presence * (counts > 0).float()
            token = pick(adjusted)
            counts.index_add_(0, token.view(1), one)
            return token

        return penalized


def stream_ids(
    model: Llama,
    ids: Sequence[int],
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_id: int | None = None,
    penalties: Penalties | None = None,
    recorder: LogprobRecorder | None = None,
) -> Generator[int, None, None]:
    """Yield up to max_new_tokens new ids continuing `ids`, one at a time as each is sampled,
    stopping before `eos_id` (which is not yielded), the logits adjusted by `penalties`. With a
    `recorder` (trainer.logprobs) each token's logprobs under the raw logits are recorded: its
    `pop()` after each id yielded gives that id's. `ids` must
    not be empty (start from BOS for no prompt). The one decoding loop: generate_ids and complete
    collect it; the inference worker streams it. The model must not be training meanwhile (several
    threads may share it in eval mode); closing the generator early stops the decoding."""
    if not ids:
        raise ValueError("stream_ids needs at least one token of context (use the BOS id)")
    if max_new_tokens <= 0:
        return
    device = next(model.parameters()).device
    generator = None
    if temperature >= MIN_TEMPERATURE:
        generator = torch.Generator(device=device)
        # torch.Generator() starts from a fixed seed; draw a fresh one when none is asked for.
        generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)

    def sample(logits: torch.Tensor) -> torch.Tensor:
        return sample_token(logits, temperature, top_k, top_p, generator)

    pick = penalties.picker(sample, model.cfg.vocab_size, device) if penalties else sample
    if recorder is not None:
        pick = recorder.wrap(pick)

    # the pool's decoder goes back when this generator ends or is closed
    with decoder_for(model) as decoder:
        yield from decode(decoder, list(ids), max_new_tokens, pick, eos_id)


def decode(
    decoder: Decoder,
    tokens: list[int],
    max_new_tokens: int,
    pick: Callable[[torch.Tensor], torch.Tensor],
    eos_id: int | None,
) -> Generator[int, None, None]:
    """stream_ids's loop over one decoder, `pick` choosing each token from the logits (appended to
    `tokens`). A decoder that queues its steps (graphed) is handed the next token on the device
    and its step queued before the token is read back: the GPU computes the next step while the
    host reads this token, yields it and its consumer handles it. A token after which the caller
    stops (eos, a closed stream) has had one step computed for nothing."""
    ctx = decoder.model.cfg.ctx
    # only a decoder that queues its steps reads tokens back behind them
    reader = TokenReader(next(decoder.model.parameters()).device) if decoder.queues_ahead else None
    # no_grad is per thread and would not survive the yields of a decorated generator on its own
    with torch.no_grad():
        logits = decoder.prefill(tokens[-ctx:] if len(tokens) <= ctx else tokens[-(ctx // 2) :])
    for n in range(1, max_new_tokens + 1):
        last = n == max_new_tokens  # no need to run the model for a token nobody will sample
        with torch.no_grad():
            chosen = pick(logits)
            ahead = reader if reader is not None and not last and decoder.position < ctx else None
            if ahead is not None:
                ahead.start(chosen)
                logits = decoder.step(chosen)
            nxt = ahead.result() if ahead is not None else int(chosen)
        if eos_id is not None and nxt == eos_id:
            return
        tokens.append(nxt)
        yield nxt
        if last:
            return
        if ahead is None:
            with torch.no_grad():
                if decoder.position >= ctx:
                    logits = decoder.prefill(tokens[-max(1, ctx // 2) :])
                else:
                    logits = decoder.step(nxt)


def context_room(prompt_tokens: int, ctx: int) -> int:
    """The tokens a reply can take before the context is full: what the prompt leaves of it, or, for
    a prompt that fills it (decoding keeps its last ctx/2 tokens, as _decode_loop does), the other
    half. At least 1."""
    return max(1, ctx - prompt_tokens if prompt_tokens < ctx else ctx - ctx // 2)


class TokenReader:
    """Reads a token id back to the host without waiting for what was queued after it: on CUDA a
    copy into pinned memory and an event recorded behind it; elsewhere a plain copy."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host = torch.empty(1, dtype=torch.long, pin_memory=self.cuda)
        self.copied = torch.cuda.Event() if self.cuda else None

    def start(self, token: torch.Tensor) -> None:
        self.host.copy_(token.view(1), non_blocking=self.cuda)
        if self.copied is not None:
            self.copied.record()

    def result(self) -> int:
        if self.copied is not None:
            self.copied.synchronize()
        return int(self.host[0])


def generate_ids(
    model: Llama,
    ids: Sequence[int],
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_id: int | None = None,
) -> list[int]:
    """Continue `ids` by up to max_new_tokens tokens; returns the new ids only, stopping before
    `eos_id` (which is not included). `ids` must not be empty (start from BOS for no prompt).
    A model in training mode is put in eval mode for the call and back afterwards."""
    was_training = model.training
    model.eval()
    try:
        return list(stream_ids(model, ids, max_new_tokens, temperature, top_k, top_p, seed, eos_id))
    finally:
        model.train(was_training)


class Completion(NamedTuple):
    text: str
    prompt_tokens: int
    # the tokens generated, counted as generated: re-encoding `text` can give another count (a
    # byte-level token that is half of a UTF-8 character decodes to U+FFFD, three bytes again)
    completion_tokens: int


def complete(
    model: Llama,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> Completion:
    """The continuation of `prompt` (not including the prompt) with its token counts. An empty
    prompt starts from BOS (which is not counted)."""
    prompt_ids = tokenizer.encode(prompt) if prompt else []
    new = generate_ids(
        model,
        prompt_ids or [tokenizer.bos_id],
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        eos_id=tokenizer.eos_id,
    )
    return Completion(tokenizer.decode(new), len(prompt_ids), len(new))


def generate(
    model: Llama,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> str:
    """The continuation of `prompt` (not including the prompt). An empty prompt starts from BOS."""
    return complete(model, tokenizer, prompt, max_new_tokens, temperature, top_k, top_p, seed).text
