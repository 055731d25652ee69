"""The data pipeline holds a bounded amount of a file, whatever its size (issue 22): the BPE trains on
a bounded sample (trainer.data.text_sample) cut where pre-tokenization splits anyway; loss spans are
written chunk by chunk and read back as a memmap; the validation split of spans is a binary search;
a JSONL line is read at most MAX_LINE_BYTES at a time. bench/upload_rss.py measures the memory."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from tests.trainer.test_loss_mask import chat_records, write_jsonl
from trainer.data import formats, prepare, text_sample
from trainer.data.formats import DataError, iter_text_chunks, parse_jsonl_line, validate_file
from trainer.data.prepare import load_spans, load_tokens, tokenize_file, tokenize_to_file
from trainer.data.spans import merge_spans, split_spans
from trainer.data.text_sample import pieces, sample_texts
from trainer.data.tokenizers import BPETokenizer, ByteTokenizer, train_tokenizer

SHAKESPEARE = Path(__file__).parent.parent / "data" / "tiny_shakespeare_100k.txt"


def words(texts: list[str]) -> list[str]:
    """The words byte-level BPE counts (its pre-tokenizer's output) over `texts`."""
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return [w for text in texts for w, _ in pre.pre_tokenize_str(text)]


def test_pieces_cut_only_where_pre_tokenization_splits() -> None:
    text = SHAKESPEARE.read_text(encoding="utf-8")
    cut = list(pieces(text, 300))
    assert len(cut) > 300 and max(len(p) for p in cut) <= 300
    assert "".join(cut) == text
    assert words(cut) == words([text])
    assert words(list(iter_text_chunks(SHAKESPEARE, 300))) == words([text])  # the tokenizer's chunks too


@pytest.mark.parametrize(
    "text",
    [
        "第一段。很长的句子\n\n第二段，另一个句子\n\n" * 200,  # no space, no lone newline: cut inside "\n\n"
        "word  \n\t\nword\n" * 300,  # runs of mixed whitespace
        "x" * 5000,  # no boundary at all: hard cuts, still within the bound
    ],
)
def test_pieces_of_text_without_lone_newlines(text: str) -> None:
    cut = list(pieces(text, 100))
    assert "".join(cut) == text and max(map(len, cut)) <= 100
    if " " in text or "\n" in text:
        assert words(cut) == words([text])


def test_a_bpe_gets_a_chunk_in_pieces_with_the_ids_of_the_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = SHAKESPEARE.read_text(encoding="utf-8").replace("\n\n", "\n\n\n")  # runs of newlines
    source = tmp_path / "runs.txt"
    source.write_text(text, encoding="utf-8")
    bpe = train_tokenizer("bpe", 1000, [text])
    assert isinstance(bpe, BPETokenizer) and "ĊĊ" in bpe.hf_tokenizer.get_vocab()  # a run is a word
    monkeypatch.setattr(prepare, "ENCODE_CHARS", 300)
    out = tmp_path / "t.tokens"
    tokenize_to_file(source, bpe, out, chunk_chars=5000)
    assert load_tokens(out, bpe.vocab_size).tolist() == bpe.encode(text)
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_records(50) + [{"text": text[:2000]}])
    texts = [t for line in chat.read_text().splitlines() for t, _ in parse_jsonl_line(line, 2).segments]
    assert any(len(t) > 300 for t in texts)
    got = prepare._encode_all(bpe, texts, np.dtype(np.uint16))
    assert [a.tolist() for a in got] == [bpe.encode(t) for t in texts]


def test_a_small_input_is_kept_whole() -> None:
    text = SHAKESPEARE.read_text(encoding="utf-8")
    docs = [text[i : i + 5000] for i in range(0, len(text), 5000)]
    kept = sample_texts(docs, max_chars=2 * len(text), piece_chars=1000)
    assert "".join(kept) == text


def test_a_big_input_is_sampled_within_the_bound_and_all_over() -> None:
    rng = random.Random(1)
    docs = [
        f"doc{i} " + " ".join(rng.choice(["alpha", "beta", "gamma"]) for _ in range(200)) for i in range(5000)
    ]
    total = sum(map(len, docs))
    max_chars, piece_chars = 200_000, 2_000
    kept = sample_texts(iter(docs), max_chars=max_chars, piece_chars=piece_chars)
    assert total > 20 * max_chars
    assert sum(map(len, kept)) <= max_chars + 2 * piece_chars
    first = [int(p[3 : p.index(" ")]) for p in kept if p.startswith("doc")]
    assert first == sorted(first)  # in input order
    assert min(first) < 500 and max(first) > 4500  # from the whole input, not its start
    assert sample_texts(iter(docs), max_chars=max_chars, piece_chars=piece_chars) == kept  # seeded


def test_bpe_on_a_small_input_is_the_one_the_whole_input_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    text = SHAKESPEARE.read_text(encoding="utf-8")
    sampled = train_tokenizer("bpe", 400, [text])  # through sample_texts: cut into pieces
    monkeypatch.setattr(text_sample, "sample_texts", lambda texts: list(texts))
    whole = train_tokenizer("bpe", 400, [text])  # the whole text as one string
    assert sampled.to_json() == whole.to_json()


@pytest.mark.parametrize("chunk_chars", [64, 1000, 1 << 20])
def test_spans_written_chunk_by_chunk_equal_the_whole_files(tmp_path: Path, chunk_chars: int) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", chat_records(120))
    tok = ByteTokenizer()
    out = tmp_path / "chat.tokens"
    n = tokenize_to_file(path, tok, out, chunk_chars=chunk_chars)
    tokens, spans = tokenize_file(path, tok)  # in memory, merged at once
    assert n == len(tokens) and spans is not None
    loaded = load_spans(out)
    assert isinstance(loaded, np.memmap)
    assert np.array_equal(np.asarray(loaded), spans)
    assert not list(tmp_path.glob("*.tmp-*"))


def test_a_file_trained_everywhere_leaves_no_span_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "text.jsonl", [{"text": f"line {i}"} for i in range(300)])
    out = tmp_path / "text.tokens"
    tokenize_to_file(path, ByteTokenizer(), out, chunk_chars=64)
    assert load_spans(out) is None and not list(tmp_path.glob("*.spans*"))


def old_split(spans: np.ndarray, cut: int) -> tuple[np.ndarray, np.ndarray]:
    """What split_spans computed before (clip everything, then merge)."""
    return merge_spans(np.clip(spans, None, cut)), merge_spans(np.clip(spans, cut, None) - cut)


def test_split_spans_by_binary_search_equals_clipping() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        edges = np.sort(rng.choice(200, size=2 * int(rng.integers(0, 12)), replace=False))
        spans = merge_spans(edges.reshape(-1, 2))
        for cut in (0, int(rng.integers(0, 200)), 200):
            left, right = split_spans(spans, cut)
            want_left, want_right = old_split(spans, cut)
            assert left is not None and right is not None
            assert np.array_equal(left, want_left) and np.array_equal(right, want_right), (spans, cut)


def test_a_jsonl_line_over_the_bound_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", 100)
    path = tmp_path / "long.jsonl"
    path.write_text('{"text": "short"}\n' + '{"text": "' + "x" * 200 + '"}\n')
    with pytest.raises(DataError, match="line 2 is over") as caught:
        validate_file(path)
    assert caught.value.line == 2
    path.write_text('{"text": "short"}\n' + '{"text": "' + "x" * 80 + '"}\n')
    assert validate_file(path).n_records == 2
