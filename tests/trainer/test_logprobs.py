"""trainer.logprobs: the logprobs recorded while decoding (raw logits, whatever the sampling) equal a
forward over the whole sequence (score); and the worker reports only the tokens of the text returned."""

from __future__ import annotations

import math
from typing import cast

import torch

from trainer.config import ModelConfig
from trainer.data.tokenizers import ByteTokenizer
from trainer.logprobs import LogprobRecorder, TokenLogprob, score
from trainer.model.llama import Llama
from trainer.sampling import Penalties, stream_ids
from trainer.text_stream import TextStream
from worker.token_logprobs import TokenTracker


def tiny() -> Llama:
    torch.manual_seed(0)
    return Llama(ModelConfig(n_layer=1, n_head=2, n_embd=16, ctx=32, vocab_size=258)).eval()


def test_recorded_logprobs_are_those_of_a_forward_over_the_sequence() -> None:
    model, prompt = tiny(), [104, 105]
    recorder = LogprobRecorder(3)
    generated, records = [], []
    for token in stream_ids(
        model,
        prompt,
        10,
        temperature=1.9,
        top_k=7,
        seed=1,
        penalties=Penalties(presence=2.0),
        recorder=recorder,
    ):
        generated.append(token)
        records.append(recorder.pop())
    scored = score(model, prompt + generated, 3)
    assert scored[0] is None and len(scored) == len(prompt) + len(generated)
    for record, want in zip(records, scored[len(prompt) :], strict=True):
        assert want is not None and math.isclose(record.logprob, want.logprob, abs_tol=1e-4)
        assert [i for i, _ in record.top] == [i for i, _ in want.top]


def test_tokens_a_stop_sequence_took_are_not_reported() -> None:
    tokenizer, text = ByteTokenizer(), TextStream(["cd"])
    fake = score(tiny(), [1, 2], 1)[1]
    assert fake is not None

    class SameRecord:  # every token picked gets the same record
        def pop(self) -> TokenLogprob:
            return fake

    tracker = TokenTracker(tokenizer, 0, cast(LogprobRecorder, SameRecord()), report_eos=True)
    reported = []
    for token in b"abcde":
        start = text.decoded
        text.push(bytes([token]))
        tracker.add(token, start, text.decoded)
        reported += tracker.ready(text.published)
        if text.stopped:
            break
    text.finish()
    reported += tracker.rest(text)
    assert [bytes.fromhex(r["b"]) for r in reported] == [b"a", b"b"] and [r["o"] for r in reported] == [0, 1]


def test_offsets_after_a_byte_that_is_no_character() -> None:
    """b"\\xc3" then b"a": the lead byte becomes U+FFFD only when "a" shows it incomplete; "a" begins
    after it (text_offset 1, not 0), generated or echoed alike."""
    from worker.token_logprobs import prompt_entries

    tokenizer, text = ByteTokenizer(), TextStream()
    fake = score(tiny(), [1, 2], 1)[1]
    assert fake is not None

    class SameRecord:
        def pop(self) -> TokenLogprob:
            return fake

    tokens = [0xC3, ord("a"), 0xC3, 0xA9, ord("b")]  # "\ufffd" "a" "é" (two bytes) "b"
    tracker = TokenTracker(tokenizer, 0, cast(LogprobRecorder, SameRecord()), report_eos=False)
    reported, out = [], ""
    for token in tokens:
        start = text.decoded
        out += text.push(bytes([token]))
        tracker.add(token, start, text.decoded)
        reported += tracker.ready(text.published)
    out += text.finish()
    reported += tracker.rest(text)
    assert out == "\ufffdaéb"
    assert [r["o"] for r in reported] == [0, 1, 2, 2, 3]
    assert [r["o"] for r in prompt_entries(tokenizer, tokens, [None] * len(tokens))] == [0, 1, 2, 2, 3]
