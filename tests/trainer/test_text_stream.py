"""trainer/text_stream.py: what an inference worker publishes as it generates is final — whole UTF-8
characters only, the possible start of a stop sequence held back, the stop sequence left out — and
all of it together is exactly the decoded text cut at the first stop sequence."""

from __future__ import annotations

import random

from trainer.text_stream import TextStream, first_stop, held_tail


def run(chunks: list[bytes], stops: list[str]) -> tuple[list[str], bool]:
    stream = TextStream(stops)
    out = []
    for chunk in chunks:
        out.append(stream.push(chunk))
        if stream.stopped:
            break
    out.append(stream.finish())
    return out, stream.stopped


def test_a_character_split_across_tokens_is_published_whole() -> None:
    euro = "€".encode()  # three bytes
    out, _ = run([b"a", euro[:1], euro[1:2], euro[2:], b"b"], [])
    assert out == ["a", "", "", "€", "b", ""]


def test_bytes_that_never_form_a_character_become_replacement_characters() -> None:
    out, _ = run([b"x", b"\xe2\x82", b"y", b"\xff", b"\xf0\x9f"], [])
    assert "".join(out) == (b"x\xe2\x82y\xff\xf0\x9f").decode("utf-8", errors="replace")
    assert out[-1] == "\ufffd"  # the unfinished character at the end, flushed by finish()


def test_nul_becomes_a_replacement_character() -> None:
    out, _ = run([b"a\x00", b"\x00b"], [])
    assert "".join(out) == "a\ufffd\ufffdb"


def test_a_stop_sequence_cuts_the_text_and_is_left_out() -> None:
    out, stopped = run([b"Hello", b" wor", b"ld", b"!"], ["world"])
    assert stopped and "".join(out) == "Hello "
    # the earliest of several stop sequences wins, wherever it is in the list
    out, stopped = run([b"abcdef"], ["ef", "cd"])
    assert stopped and "".join(out) == "ab"


def test_the_possible_start_of_a_stop_sequence_is_held_until_it_is_decided() -> None:
    stream = TextStream(["\nUSER:"])
    assert stream.push(b"Hi.") == "Hi."
    assert stream.push(b"\nUS") == ""  # could become the stop sequence
    assert stream.push(b"A") == "\nUSA"  # it did not: released at once, nothing else held
    assert stream.push(b"\nUSER") == ""
    assert stream.push(b": more") == "" and stream.stopped
    assert stream.finish() == ""


def test_a_held_tail_is_published_when_generation_ends() -> None:
    out, stopped = run([b"one", b" tw"], ["two"])
    assert not stopped and out == ["one", " ", "tw"]


def test_a_chat_reply_that_ends_with_eos_drops_the_templates_newline() -> None:
    """The template ends every message with "\n"; EOS after it ends the reply, which is the text
    before it: the same text a reply cut at the next role marker ("\n<|") gives."""
    eos = TextStream(["\n<|"], trailing="\n")
    out = eos.push(b"Hello\n") + eos.push(b"there\n") + eos.push(b"") + eos.finish()
    marker = TextStream(["\n<|"], trailing="\n")
    cut = marker.push(b"Hello\n") + marker.push(b"there\n") + marker.push(b"<|user|>")
    assert out == cut == "Hello\nthere"
    plain = TextStream(["\n<|"])  # a completion keeps its text to the end
    assert plain.push(b"Hello\n") + plain.finish() == "Hello\n"
    # cut short by max_tokens right after a newline: no EOS came, the newline is the reply's
    short = TextStream(["\n<|"], trailing="\n")
    assert short.push(b"Hello") + short.push(b"\n") + short.finish(at_eos=False) == "Hello\n"


def test_a_stop_sequence_inside_a_multibyte_character_stream() -> None:
    text = "naïve café → résumé"
    data = text.encode()
    chunks = [data[i : i + 1] for i in range(len(data))]  # byte by byte: characters split everywhere
    out, stopped = run(chunks, ["é →"])
    assert stopped and "".join(out) == "naïve caf"


def test_published_text_equals_the_decoded_text_cut_at_the_first_stop() -> None:
    rng = random.Random(7)
    alphabet = "ab€\n<|é".encode() + b"\xff\xc3\x00"
    for _ in range(500):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data), rng.randint(0, 10))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        stops = rng.sample(["\n<|", "b€", "aa", "é\n", "\ufffda"], k=rng.randint(0, 3))
        decoded = data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        cut = first_stop(decoded, stops)
        out, stopped = run(chunks, stops)
        assert "".join(out) == (decoded if cut is None else decoded[:cut]), (data, chunks, stops)
        assert stopped == (cut is not None)


def test_held_tail() -> None:
    assert held_tail("abc", ["cd"]) == 1
    assert held_tail("abc", ["bcd", "cx"]) == 2
    assert held_tail("abc", ["abc"]) == 0  # a whole stop sequence is found, not held
    assert held_tail("aaa", ["aab"]) == 2
    assert held_tail("", ["x"]) == 0 and held_tail("abc", []) == 0


def test_the_api_cuts_the_output_into_the_pieces_the_worker_appended() -> None:
    from api.inference import split_pieces

    assert split_pieces("Hello, wor", "5,2,3,") == ["Hello", ", ", "wor"]
    assert split_pieces("", "") == []
    assert split_pieces("ab", "1,") == ["a", "b"]  # text without a recorded length still goes out
    assert split_pieces("é€x", "1,1,1,") == ["é", "€", "x"]  # lengths count characters, not bytes
