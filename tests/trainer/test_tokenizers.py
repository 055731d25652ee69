import json
from pathlib import Path

import pytest

from trainer.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    BPETokenizer,
    ByteTokenizer,
    _build_hf_bpe,
    bytes_to_unicode,
    tokenizer_from_json,
    train_tokenizer,
)

DATA = Path(__file__).parent.parent / "data"
MIXED = [
    "Hello, world! The quick brown fox.",
    "emoji: 😀🙂👩‍👩‍👧 and flags 🇫🇷",
    "CJK: 日本語のテキスト，中文字符，한국어",
    "  leading spaces\n\n\ttabs\r\nwindows lines   trailing  ",
    "literal specials <s> and </s> stay text",
    "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    "",
]


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    text = (DATA / "tiny_shakespeare_100k.txt").read_text(encoding="utf-8")
    tok = train_tokenizer("bpe", 400, [text])
    assert isinstance(tok, BPETokenizer)
    return tok


def test_bytes_to_unicode_is_gpt2_map() -> None:
    m = bytes_to_unicode()
    assert len(set(m.values())) == 256
    assert m[ord("A")] == "A" and m[ord(" ")] == "Ġ" and m[ord("\n")] == "Ċ" and m[0] == "Ā"


def test_byte_layout() -> None:
    tok = ByteTokenizer()
    assert (tok.kind, tok.vocab_size, tok.bos_id, tok.eos_id) == ("byte", 258, 256, 257)
    assert tok.encode("Az\n") == [65, 122, 10]
    assert tok.token_bytes(0xFF) == b"\xff"
    assert tok.token_bytes(BOS_ID) == b"" and tok.token_bytes(EOS_ID) == b""
    with pytest.raises(IndexError):
        tok.token_bytes(258)


@pytest.mark.parametrize("text", MIXED)
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_byte_invalid_utf8_and_specials() -> None:
    tok = ByteTokenizer()
    raw = b"ok \xff\xfe then \xe6\x97 cut"  # invalid bytes and a truncated 3-byte sequence
    ids = list(raw)
    assert tok.decode(ids) == raw.decode("utf-8", errors="replace")
    assert "\ufffd" in tok.decode(ids)
    assert b"".join(tok.token_bytes(i) for i in ids) == raw  # token_bytes is lossless where str is not
    assert tok.decode([BOS_ID, *b"hi", EOS_ID]) == "hi"


def test_byte_json_round_trip() -> None:
    d = ByteTokenizer().to_json()
    assert json.loads(json.dumps(d)) == d
    tok = tokenizer_from_json(d)
    assert isinstance(tok, ByteTokenizer) and tok.to_json() == d


def test_bpe_vocab_size_and_layout(bpe: BPETokenizer) -> None:
    assert bpe.kind == "bpe" and bpe.vocab_size == 400
    for b in range(256):
        assert bpe.token_bytes(b) == bytes([b])
    assert bpe.token_bytes(BOS_ID) == b"" and bpe.token_bytes(EOS_ID) == b""
    assert all(len(bpe.token_bytes(i)) >= 2 for i in range(258, 400))  # merges are multi-byte
    assert len(bpe.merges) == 400 - 258
    ends_a_line = [i for i in range(bpe.vocab_size) if bpe.token_bytes(i).endswith(b"\n")]
    assert ends_a_line[0] == 10


@pytest.mark.parametrize("text", MIXED)
def test_bpe_round_trip(bpe: BPETokenizer, text: str) -> None:
    ids = bpe.encode(text)
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert BOS_ID not in ids and EOS_ID not in ids  # literal "<s>" is text, not a special
    assert bpe.decode(ids) == text
    assert b"".join(bpe.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_bpe_compresses_english(bpe: BPETokenizer) -> None:
    text = "And what is the matter with the king, my lord?"
    assert len(bpe.encode(text)) < 0.7 * len(text.encode("utf-8"))


def test_bpe_invalid_utf8_and_specials(bpe: BPETokenizer) -> None:
    assert bpe.decode([0xFF, ord("a"), 0xE6]) == "\ufffda\ufffd"
    ids = bpe.encode("the king")
    assert bpe.decode([BOS_ID, *ids, EOS_ID]) == "the king"


def test_bpe_json_round_trip(bpe: BPETokenizer) -> None:
    d = bpe.to_json()
    d2 = json.loads(json.dumps(d))
    tok = tokenizer_from_json(d2)
    assert isinstance(tok, BPETokenizer)
    assert tok.to_json() == d
    for text in MIXED:
        assert tok.encode(text) == bpe.encode(text)


def test_bpe_hf_json_loads_standalone(bpe: BPETokenizer) -> None:
    # Exports ship the embedded JSON as tokenizer.json; plain HF must tokenize identically.
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(bpe.to_json()["hf_tokenizer"])
    text = "First Citizen:\nBefore we proceed any further, hear me speak. 日本"
    assert hf.encode(text, add_special_tokens=False).ids == bpe.encode(text)
    assert hf.token_to_id("<s>") == BOS_ID and hf.token_to_id("</s>") == EOS_ID


def test_bpe_merges_spelling_specials_are_dropped() -> None:
    tok = BPETokenizer(_build_hf_bpe([("<", "s"), ("<s", ">"), ("<s>", "x"), ("a", "b")]))
    assert tok.vocab_size == 260  # "<s" and "ab" only
    ids = tok.encode("<s>ab")
    assert BOS_ID not in ids and tok.decode(ids) == "<s>ab"


def test_train_tokenizer_errors() -> None:
    assert isinstance(train_tokenizer("byte", None, []), ByteTokenizer)
    with pytest.raises(ValueError, match="258"):
        train_tokenizer("byte", 300, [])
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        train_tokenizer("wordpiece", 300, [])
    with pytest.raises(ValueError, match="at least"):
        train_tokenizer("bpe", 100, ["abc"])
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_json({"kind": "sentencepiece"})


def test_bpe_small_corpus_gives_fewer_ids() -> None:
    tok = train_tokenizer("bpe", 1000, ["ab ab ab"])
    assert 258 < tok.vocab_size < 1000
    assert tok.decode(tok.encode("ab ba")) == "ab ba"
