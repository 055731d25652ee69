import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import trainer.data.prepare as data_mod
from trainer.data.formats import (
    DataError,
    FileSummary,
    detect_format,
    iter_documents,
    iter_text_chunks,
    validate_file,
)
from trainer.data.prepare import (
    BatchSampler,
    load_tokens,
    prepare_data,
    tokenize_to_file,
)
from trainer.data.tokenizers import EOS_ID, ByteTokenizer, train_tokenizer

torch.set_num_threads(1)
DATA = Path(__file__).parent.parent / "data"
SHAKES = DATA / "tiny_shakespeare_100k.txt"


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return p


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", 320, [SHAKES.read_text(encoding="utf-8")])


# --- formats and validation -------------------------------------------------------------------


def test_detect_format(tmp_path: Path) -> None:
    assert detect_format(SHAKES) == "text"
    assert detect_format(DATA / "sample_chat.jsonl") == "jsonl"
    assert detect_format(write(tmp_path, "d.txt", '\n\n{"text": "hi"}\n')) == "jsonl"
    assert detect_format(write(tmp_path, "e.txt", "[1, 2]\nplain\n")) == "text"
    assert detect_format(write(tmp_path, "f.jsonl", "not json at all\n")) == "jsonl"
    # a JSONL file whose first record is broken is JSONL (its validation names the line), not text
    records = '{"prompt": "broken", "completion": \n{"prompt": "a", "completion": "b"}\n'
    assert detect_format(write(tmp_path, "g", records)) == "jsonl"
    assert detect_format(write(tmp_path, "h.json", "[{")) == "jsonl"  # a JSON name says so
    assert detect_format(write(tmp_path, "i", "{not a record, a brace}\nplain text\n")) == "text"
    with pytest.raises(DataError, match="line 1: invalid JSON"):
        validate_file(write(tmp_path, "j.txt", records))


def test_validate_samples() -> None:
    assert validate_file(DATA / "sample_text.jsonl").n_records == 36
    assert validate_file(DATA / "sample_prompt_completion.jsonl").n_records == 36
    s = validate_file(DATA / "sample_chat.jsonl")
    assert s.format == "jsonl" and s.n_records == 30
    s = validate_file(SHAKES)
    size = SHAKES.stat().st_size  # a text file's bound on its tokens is its bytes
    assert s == FileSummary("text", SHAKES.read_text(encoding="utf-8").count("\n"), size, size)


@pytest.mark.parametrize(
    ("content", "line", "needle"),
    [
        (b"", None, "empty"),
        (b"  \n\t\n", None, "only whitespace"),
        (b"fine line\nsecond \xff\xfe line\n", 2, "byte offset 17"),
        (b"abc\x00def", 1, "NUL byte at byte offset 3"),
        (b'{"text": "a"}\n{"text": "b"}\n{"text": "c"\n', 3, "line 3: invalid JSON"),
        # an object left open: placed at the line's end, not at column 1 of a line after it
        (b'{"text": "hi"\n', 1, "invalid JSON (Expecting ',' delimiter at column 14)"),
        (b'{"text": "a"}\n\n{"txt": "b"}\n', 3, "it has: txt"),
        (b'{"text": 5}\n', 1, '"text" must be a string'),
        (b'{"prompt": "p"}\n', 1, '"completion" is missing (prompt/completion records need both)'),
        (b'{"prompt": "p", "completion": null}\n', 1, '"completion" must be a string'),
        # two shapes in one record: neither is dropped silently
        (
            b'{"text": "a"}\n{"prompt": "p", "completion": "c", "text": "t"}\n',
            2,
            '"prompt"/"completion" and "text"',
        ),
        (b'{"text": "a\x01b"}\n', 1, "invalid JSON (Invalid control character at column 12)"),
        (b'{"messages": [{"role": "user", "content": null}]}\n', 1, "messages[0].content must be a string"),
        (b'{"messages": [{"role": "user"}, "hi"]}\n', 1, "messages[0].content"),
        (b'{"messages": []}\n', 1, 'non-empty list of {"role", "content"} objects, got an empty list'),
        (b'{"text": "a"}\n[1, 2]\n', 2, "expected a JSON object, got list"),
        (b'{"text": "a"}\n{"text": "\xc3"}\n', 2, "byte offset 24"),
        # what a file that is not UTF-8 text is, named with its fix
        ("hi there\n".encode("utf-16"), 1, "is UTF-16 text (little-endian"),
        (b"\x1f\x8b\x08\x00rest", 1, "is gzip-compressed; decompress it"),
        (b"caf\xe9\n", 1, "iconv -f CP1252"),
        (b'{"text": "a"}\n\xef\xbb\xbf{"text": "b"}\n', 2, "line 2 starts with a byte-order mark"),
    ],
)
def test_validate_errors(tmp_path: Path, content: bytes, line: int | None, needle: str) -> None:
    name = "bad.jsonl" if content.startswith(b"{") else "bad.txt"
    p = write(tmp_path, name, content)
    with pytest.raises(DataError) as e:
        validate_file(p)
    assert needle in str(e.value)
    assert e.value.line == line


def test_validate_only_blank_jsonl_and_size_limit(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no JSONL records"):
        validate_file(write(tmp_path, "blank.jsonl", "\n\n"))
    with pytest.raises(DataError, match="over the limit of 10 bytes"):
        validate_file(SHAKES, max_bytes=10)


def test_invalid_utf8_across_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.data.formats as df

    monkeypatch.setattr(df, "_READ_BYTES", 4)
    # "日" is 3 bytes split over two reads; then a stray continuation byte at offset 9.
    p = write(tmp_path, "x.txt", "ab\n日本".encode() + b"\x80z")
    with pytest.raises(DataError) as e:
        validate_file(p)
    assert e.value.offset == 9 and e.value.line == 2
    assert validate_file(write(tmp_path, "ok.txt", "ab\n日本語\n")).n_records == 2


@pytest.mark.parametrize("name", ["bad.txt", "bad.jsonl"])
def test_iter_documents_reports_bad_utf8(tmp_path: Path, name: str) -> None:
    content = b'{"text": "ok"}\n{"text": "\xff"}\n' if name.endswith("jsonl") else b"ok\nthen \xff\n"
    with pytest.raises(DataError) as e:
        list(iter_documents(write(tmp_path, name, content)))
    assert e.value.line == 2 and "byte offset" in str(e.value)


def test_iter_documents_shapes() -> None:
    chat = list(iter_documents(DATA / "sample_chat.jsonl"))
    assert len(chat) == 30
    assert chat[0] == (
        "<|system|>\nYou are a patient science tutor.\n<|user|>\nWhat should I know about water?\n"
        "<|assistant|>\nWater boils at 100 degrees Celsius at sea level.\n"
    )
    pc = list(iter_documents(DATA / "sample_prompt_completion.jsonl"))
    assert pc[1] == "Q: What is 3 plus 8?\nA: 11\n"
    texts = list(iter_documents(DATA / "sample_text.jsonl"))
    assert texts[0] == "Note 1 on water: Water boils at 100 degrees Celsius at sea level."


def test_text_chunks_reassemble_at_boundaries(tmp_path: Path) -> None:
    text = SHAKES.read_text(encoding="utf-8")
    chunks = list(iter_text_chunks(SHAKES, chunk_chars=1000))
    assert "".join(chunks) == text
    assert len(chunks) > 50
    for c, nxt in zip(chunks, chunks[1:], strict=False):
        assert c.endswith("\n") and not nxt[0].isspace()  # cut after a newline, before a word
    # One long line: cuts fall before a space between words; no whitespace at all: hard cuts.
    line = write(tmp_path, "line.txt", "word " * 1000)
    chunks = list(iter_text_chunks(line, chunk_chars=64))
    assert "".join(chunks) == "word " * 1000 and all(c.startswith(" ") for c in chunks[1:])
    blob = write(tmp_path, "blob.txt", "x" * 1000)
    chunks = list(iter_text_chunks(blob, chunk_chars=64))
    assert "".join(chunks) == "x" * 1000 and max(map(len, chunks)) <= 5 * 64  # memory stays bounded
    assert "".join(iter_documents(write(tmp_path, "bom.txt", "\ufeffhi\r\nthere"))) == "hi\r\nthere"


# --- tokenizing ----------------------------------------------------------------------------


def test_tokenize_text_chunked_equals_whole(tmp_path: Path, bpe) -> None:
    text = SHAKES.read_text(encoding="utf-8")
    out = tmp_path / "t.bin"
    n = tokenize_to_file(SHAKES, bpe, out, chunk_chars=777)
    tokens = load_tokens(out, bpe.vocab_size)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16 and len(tokens) == n
    assert tokens.tolist() == bpe.encode(text)  # chunk cuts do not change the tokens
    assert EOS_ID not in tokens
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]  # no temp file left behind

    n = tokenize_to_file(SHAKES, ByteTokenizer(), out)
    assert load_tokens(out, 258).astype(np.uint8).tobytes() == SHAKES.read_bytes()


@pytest.mark.parametrize("name", ["sample_text.jsonl", "sample_chat.jsonl", "sample_prompt_completion.jsonl"])
def test_tokenize_jsonl_appends_eos(tmp_path: Path, bpe, name: str) -> None:
    docs = list(iter_documents(DATA / name))
    out = tmp_path / "t.bin"
    n = tokenize_to_file(DATA / name, bpe, out, chunk_chars=200)
    tokens = load_tokens(out, bpe.vocab_size).tolist()
    assert n == len(tokens) and tokens[-1] == EOS_ID and tokens.count(EOS_ID) == len(docs)
    pieces, cur = [], []
    for t in tokens:
        if t == EOS_ID:
            pieces.append(bpe.decode(cur))
            cur = []
        else:
            cur.append(t)
    assert pieces == docs


class _BigVocab(ByteTokenizer):
    vocab_size = 70000

    def encode(self, text: str) -> list[int]:
        return [69999 for _ in text.encode()]


def test_uint32_for_big_vocab(tmp_path: Path) -> None:
    out = tmp_path / "big.bin"
    tokenize_to_file(write(tmp_path, "a.txt", "abc"), _BigVocab(), out)
    tokens = load_tokens(out, 70000)
    assert tokens.dtype == np.uint32 and tokens.tolist() == [69999] * 3
    with pytest.raises(DataError, match="not a whole number"):
        load_tokens(write(tmp_path, "odd.bin", b"abc"), 258)


def test_prepare_data_split_and_validation_file(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    raw = SHAKES.read_bytes()
    td = prepare_data(SHAKES, tok, val_fraction=0.1)
    n_val = int(len(raw) * 0.1)
    assert len(td.val) == n_val and len(td.train) == len(raw) - n_val
    assert np.concatenate([td.train, td.val]).astype(np.uint8).tobytes() == raw
    assert prepare_data(SHAKES, tok, val_fraction=0.0).val is None
    td = prepare_data(SHAKES, tok, validation_path=DATA / "sample_text.jsonl")
    assert len(td.train) == len(raw) and td.val[-1] == EOS_ID
    with pytest.raises(DataError, match="line 1"):
        prepare_data(write(tmp_path, "bad.jsonl", "{oops\n"), tok)


def test_prepare_data_cache(tmp_path: Path, bpe, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    first = prepare_data(SHAKES, bpe, cache_dir=cache)
    assert isinstance(first.train, np.memmap)
    assert len(list(cache.iterdir())) == 1

    def boom(*a, **k):
        raise AssertionError("re-tokenized despite the cache")

    monkeypatch.setattr(data_mod, "tokenize_to_file", boom)
    again = prepare_data(SHAKES, bpe, cache_dir=cache)
    assert np.array_equal(first.train, again.train) and np.array_equal(first.val, again.val)
    monkeypatch.undo()
    prepare_data(SHAKES, ByteTokenizer(), cache_dir=cache)  # another tokenizer: another entry
    copy = write(tmp_path, "copy.txt", SHAKES.read_bytes() + b"more\n")
    prepare_data(copy, bpe, cache_dir=cache)  # other content: another entry
    assert len(list(cache.iterdir())) == 3


# --- batches -------------------------------------------------------------------------------


def positions(n: int) -> np.ndarray:
    # Token value == position, so a batch reveals which windows it took.
    return np.arange(n, dtype=np.uint32)


def test_batches_shape_and_shift() -> None:
    tokens = positions(1000)
    s = BatchSampler(tokens, ctx=16, batch_size=8, seed=0)
    x, y = s.next_batch()
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)  # consecutive tokens: y is x shifted by one
    assert int(x[:, 0].min()) >= 0 and int(y[:, -1].max()) <= 999


def test_batches_are_seeded() -> None:
    tokens = positions(5000)
    a = [BatchSampler(tokens, 8, 4, seed=1).next_batch()[0] for _ in range(2)]
    assert torch.equal(a[0], a[1])
    b = BatchSampler(tokens, 8, 4, seed=2).next_batch()[0]
    assert not torch.equal(a[0], b)


def test_random_windows_cover_the_ends() -> None:
    s = BatchSampler(positions(12), ctx=10, batch_size=64, seed=0)
    starts = set(s.next_batch()[0][:, 0].tolist())
    assert starts == {0, 1}  # both possible windows, never past the end


def test_samples_after_nl() -> None:
    tokens = positions(3000)
    newline_positions = [100, 517, 518, 1999, 2990]  # the last is too close to the end to start after
    s = BatchSampler(
        tokens, ctx=32, batch_size=64, seed=3, samples_after_nl=True, newline_id=newline_positions
    )
    seen: set[int] = set()
    for _ in range(10):
        seen |= set(s.next_batch()[0][:, 0].tolist())
    assert seen == {0, 101, 518, 519, 2000}


def test_samples_after_nl_with_real_newlines(bpe) -> None:
    tokens = np.asarray(bpe.encode(SHAKES.read_text(encoding="utf-8")[:20000]), dtype=np.uint16)
    s = BatchSampler(tokens, ctx=32, batch_size=16, seed=0, samples_after_nl=True, newline_id=10)
    x, _ = s.next_batch()
    starts_ok = set(np.flatnonzero(tokens == 10) + 1) | {0}
    for row in x.numpy():
        hits = [i for i in starts_ok if i + 32 <= len(tokens) and np.array_equal(tokens[i : i + 32], row)]
        assert hits


def test_epochs_visit_each_window_once_then_reshuffle() -> None:
    ctx, n = 10, 503
    s = BatchSampler(positions(n), ctx=ctx, batch_size=7, seed=5, epochs=2)
    expected = list(range(0, n - ctx, ctx))  # 0, 10, ..., 490 (window 490..500 fits, 500 does not)
    assert s.windows_per_epoch == len(expected) == 50
    assert s.total_steps == s.steps_for_epochs(2) == math.ceil(100 / 7)
    starts: list[int] = []
    for _ in range(s.total_steps):
        starts += s.next_batch()[0][:, 0].tolist()
    first, second = starts[:50], starts[50:100]
    assert sorted(first) == expected and sorted(second) == expected
    assert first != second and first != expected
    assert s.epoch == 2


def test_epochs_mode_depends_on_seed() -> None:
    a = BatchSampler(positions(500), 10, 5, seed=1, epochs=1).next_batch()[0]
    b = BatchSampler(positions(500), 10, 5, seed=2, epochs=1).next_batch()[0]
    assert not torch.equal(a, b)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"samples_after_nl": True, "newline_id": [7, 50, 51, 300, 1000]},
        {"epochs": 3},
        {"epochs": 2, "samples_after_nl": True, "newline_id": list(range(0, 2000, 37))},
    ],
)
def test_resume_gives_identical_batches(kwargs: dict) -> None:
    tokens = positions(2000)
    straight = BatchSampler(tokens, ctx=24, batch_size=9, seed=11, **kwargs)
    expected = [straight.next_batch() for _ in range(30)]

    first = BatchSampler(tokens, ctx=24, batch_size=9, seed=11, **kwargs)
    for _ in range(13):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # must survive a JSON checkpoint
    resumed = BatchSampler(tokens, ctx=24, batch_size=9, seed=11, **kwargs)
    resumed.load_state_dict(state)
    assert resumed.epoch == first.epoch
    for x_exp, y_exp in expected[13:]:
        x, y = resumed.next_batch()
        assert torch.equal(x, x_exp) and torch.equal(y, y_exp)


def test_state_mismatch_is_refused() -> None:
    state = BatchSampler(positions(500), 10, 2, seed=0).state_dict()
    with pytest.raises(ValueError, match="n_tokens"):
        BatchSampler(positions(400), 10, 2, seed=0).load_state_dict(state)


def test_too_short_for_one_window() -> None:
    with pytest.raises(DataError, match=r"has 64 tokens.*ctx=64"):
        BatchSampler(positions(64), ctx=64, batch_size=2, seed=0)
    BatchSampler(positions(65), ctx=64, batch_size=2, seed=0).next_batch()
