"""Training-data formats: detect, validate and iterate documents. Torch-free and numpy-free (the API
imports this to validate uploads), and streaming: files are read line by line or in chunks, never
whole.

Formats
-------
- **text**: any UTF-8 file. The whole file is one document; it is yielded in chunks of about
  `chunk_chars` characters, each cut right after a newline that is between two non-space characters
  (or, failing that, right before a space between two words, or before the newline that ends a
  longer run of whitespace; see `split_point`). At such points GPT-2-style byte-level
  pre-tokenization splits anyway, so tokenizing chunk by chunk gives the same tokens as tokenizing
  the whole file. Plain text gets no BOS/EOS. A leading UTF-8 BOM is dropped; line endings are kept
  as they are.
- **jsonl**: one JSON object per line (blank lines are skipped), each line at most MAX_LINE_BYTES
  (8 MiB) long, newline included. Each record is one of
    {"text": str}                                   -> text
    {"prompt": str, "completion": str}              -> prompt + completion (no separator added)
    {"messages": [{"role": str, "content": str}, ...]}  -> chat template, one block per message:
        "<|{role}|>\\n{content}\\n"   e.g. "<|user|>\\nHi\\n<|assistant|>\\nHello!\\n"
  Extra keys are ignored. When tokenized, every JSONL document is followed by EOS.
  A message's `content` is a string or OpenAI's list of text parts ([{"type": "text", "text": str}],
  joined with nothing between them); null content (OpenAI's assistant-with-tool-calls) and other part
  types are refused: there are no tools or images here. An assistant message may carry OpenAI's
  `weight` (0 or 1; 0 leaves that turn out of the loss); other roles may not. A role is "system",
  "user" or "assistant" (chat.CHAT_ROLES): the roles a chat prompt can have at inference.

Loss masking
------------
`record_to_document` renders a record as a `Document`: its text in `segments`, each marked with
whether the loss covers it (`trained`), and whether the EOS after it is trained (`eos_trained`):
- text: all of it, and the EOS;
- prompt/completion: the completion and the EOS, not the prompt;
- messages: each assistant message's content and the newline that ends it (the model learns to end
  its turn: at inference the reply stops at the next role marker, "\\n<|"), and the EOS when the
  conversation ends with a trained assistant message; never the role headers ("<|assistant|>\\n" is
  the prompt's end at inference) nor other roles' messages. `weight: 0` leaves a turn (and its EOS)
  out.
Adjacent segments with the same mark are joined, so a chat's prompt part is one segment, exactly the
text an inference prompt renders. The trainer tokenizes each segment on its own
(trainer.data.prepare); `train_on_inputs` trains on every token instead.

`detect_format`: "jsonl" if the name ends in .jsonl, .ndjson or .json, or the first non-blank line
parses as a JSON object (or opens one, broken, and the next line is one), else "text". `validate_file` raises `DataError(message, line)` naming the 1-based line
(and, for bad UTF-8, the byte offset) so the user can find and fix the problem.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# re-exported: the API and the worker import them from here
from trainer.data.errors import NOT_UTF8_SIGNATURES, DataError, JSONTooDeep, not_utf8
from trainer.data.json_depth import (
    LONE_SURROGATE,
    MAX_JSON_DEPTH,
    JSONPath,
    NumberTooLong,
    TooDeep,
    first_string_where,
    has_lone_surrogate,
    loads_bounded,
)
from trainer.data.records import SHAPES_HELP, Document, record_to_document

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "MAX_LINE_BYTES",
    "SHAPES_HELP",
    "MAX_JSON_DEPTH",
    "DataError",
    "Document",
    "FileSummary",
    "JSONTooDeep",
    "detect_format",
    "iter_documents",
    "iter_jsonl_documents",
    "iter_text_chunks",
    "parse_jsonl_line",
    "record_to_document",
    "split_point",
    "validate_file",
]

Format = Literal["text", "jsonl"]

DEFAULT_CHUNK_CHARS = 1 << 20  # ~1 MB of text per chunk keeps memory bounded
_READ_BYTES = 1 << 20
_DETECT_LIMIT = 64 << 20  # the first line is read at most this far when sniffing the format
# A JSON name makes a file JSONL whatever its first line: one with a broken first record gets that
# line's error, not trained as text. (A stored file's format is still its content's: a file these
# names force passes validation only when every line is a record, which the content sniff reads
# as JSONL too, so the worker's cached copy, named by its sha256, is read the same way.)
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
# A JSONL record (one line) is parsed whole, so its length bounds the memory reading one takes: a
# 1 GiB upload of one line would otherwise be 1 GiB of bytes, then of text, then of JSON.
MAX_LINE_BYTES = 8 << 20
_BOM = "\ufeff"


@dataclass(frozen=True)
class FileSummary:
    format: Format
    n_records: int  # jsonl: records; text: lines
    n_bytes: int
    # An upper bound of the tokens the file gives, exact for the byte tokenizer: every token (a byte
    # or a BPE piece) covers at least one byte of the text a document renders to, plus a JSONL
    # document's EOS. For JSONL, far below n_bytes: the JSON syntax and escapes are not text.
    max_tokens: int
    # The same bound for the tokens the loss covers (completions, assistant turns and the EOS each
    # trains), without train_on_inputs: 0 means nothing to learn. None: every token (plain text).
    max_trained_tokens: int | None = None


def parse_jsonl_line(raw: str, line: int, max_depth: int = MAX_JSON_DEPTH) -> Document | None:
    """Parse one JSONL line into its document; None for a blank line. A record nested more than
    `max_depth` levels is a JSONTooDeep (json.loads would recurse once per level)."""
    if line == 1:
        raw = raw.removeprefix(_BOM)
    elif raw.startswith(_BOM):
        raise DataError(
            f"line {line} starts with a byte-order mark (U+FEFF), as the start of a file does: files "
            "joined together? Remove it",
            line,
        )
    if not raw.strip():
        return None
    raw = raw.rstrip("\r\n")  # else an error at the line's end is placed at column 1 of the next
    try:
        record = loads_bounded(raw, max_depth)
    except TooDeep:
        raise JSONTooDeep(line, max_depth) from None
    except NumberTooLong as e:
        raise DataError(f"line {line}: the record holds {e}; {SHAPES_HELP}", line) from None
    except json.JSONDecodeError as e:
        raise DataError(
            # json's messages end in "at" ("Invalid control character at"), ours adds the place
            f"line {line}: invalid JSON ({e.msg.removesuffix(' at')} at column {e.colno}); {SHAPES_HELP}",
            line,
        ) from e
    if (found := first_string_where(record, has_lone_surrogate)) is not None:
        raise _lone_surrogate(line, *found)
    return record_to_document(record, line)


def _lone_surrogate(line: int, path: JSONPath, text: str) -> DataError:
    """A string with half of a surrogate pair (`"\\ud83d"`, e.g. an emoji cut in two): not text."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "a key"
    char = LONE_SURROGATE.search(text)
    assert char is not None
    return DataError(
        f"line {line}: {where} holds the lone surrogate U+{ord(char.group()):04X}, which is not text "
        "(half of a character outside the Basic Multilingual Plane, such as an emoji cut in two)",
        line,
    )


def iter_jsonl_documents(lines: Iterable[str]) -> Iterator[Document]:
    """Documents from JSONL lines (e.g. an upload stream), raising DataError naming the line."""
    for n, raw in enumerate(lines, 1):
        doc = parse_jsonl_line(raw, n)
        if doc is not None:
            yield doc


def detect_format(path: str | os.PathLike[str]) -> Format:
    """The file's format: JSONL for a JSON name (JSONL_SUFFIXES), else by its first non-blank line,
    a JSON record or not. A first line that opens a record but does not parse, followed by a record,
    is a JSONL file with a broken line (its validation says which), not text."""
    if Path(path).suffix.lower() in JSONL_SUFFIXES:
        return "jsonl"
    lines = _first_lines(Path(path), 2)
    if not lines:
        return "text"
    if _is_record(lines[0]):
        return "jsonl"
    opens_a_record = lines[0].lstrip().startswith(("{", "["))
    return "jsonl" if opens_a_record and len(lines) > 1 and _is_record(lines[1]) else "text"


def _first_lines(path: Path, n: int) -> list[str]:
    """The file's first `n` non-blank lines (each read at most _DETECT_LIMIT bytes far)."""
    lines: list[str] = []
    with open(path, "rb") as f:
        while len(lines) < n and (raw := f.readline(_DETECT_LIMIT)):
            text = raw.decode("utf-8", errors="replace").removeprefix(_BOM)
            if text.strip():
                lines.append(text)
    return lines


def _is_record(line: str) -> bool:
    """A JSON object (or an array of them: a JSON file, which JSONL validation then explains)."""
    try:
        value = loads_bounded(line)
    except TooDeep:  # validation names the line and the limit
        return line.lstrip().startswith("{")
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
    )


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The file's sha256, read in 1 MiB pieces (the data cache's key; an upload's retry check)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def validate_file(
    path: str | os.PathLike[str],
    max_bytes: int | None = None,
    name: str | None = None,
    max_depth: int = MAX_JSON_DEPTH,
) -> FileSummary:
    """Check a training file without loading it whole; DataError says what is wrong and where.
    Messages call the file `name` (default: its file name; a service passes what its user knows
    the file as, not the name of its temporary copy). `max_depth` bounds a JSONL record's nesting."""
    path = Path(path)
    name = name or path.name
    n_bytes = path.stat().st_size
    if n_bytes == 0:
        raise DataError(f"{name} is empty; training data is plain UTF-8 text or JSONL records")
    if max_bytes is not None and n_bytes > max_bytes:
        raise DataError(f"{name} is {n_bytes} bytes, over the limit of {max_bytes} bytes")
    with open(path, "rb") as f:
        head = f.read(4)
    for signature, what in NOT_UTF8_SIGNATURES.items():
        if head.startswith(signature):
            raise DataError(f"{name} is {what}; training data is plain UTF-8 text or JSONL records", 1)
    fmt = detect_format(path)
    if fmt == "jsonl":
        n_records, max_tokens, trained = _validate_jsonl(path, name, max_depth)
        return FileSummary(fmt, n_records, n_bytes, max_tokens, trained)
    return FileSummary(fmt, _validate_text(path, name), n_bytes, n_bytes)


def _validate_text(path: Path, name: str) -> int:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    consumed = 0  # bytes read before the current chunk
    newlines = 0
    has_content = False
    ends_with_newline = False
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_READ_BYTES)
            final = not chunk
            pending = decoder.getstate()[0]  # undecoded tail of the previous chunk
            try:
                text = decoder.decode(chunk, final=final)
            except UnicodeDecodeError as e:
                offset = consumed - len(pending) + e.start
                line = newlines + 1 + (pending + chunk)[: e.start].count(b"\n")
                raise not_utf8(offset, line, e) from e
            nul = text.find("\0")
            if nul >= 0:
                offset = consumed - len(pending) + len(text[:nul].encode("utf-8"))
                line = newlines + 1 + text[:nul].count("\n")
                raise DataError(
                    f"binary data: NUL byte at byte offset {offset} (line {line}); "
                    "training data is plain UTF-8 text",
                    line,
                    offset=offset,
                )
            newlines += text.count("\n")
            has_content = has_content or bool(text.strip().strip(_BOM))
            if text:
                ends_with_newline = text.endswith("\n")
            if final:
                break
            consumed += len(chunk)
    if not has_content:
        raise DataError(f"{name} contains only whitespace; there is nothing to train on")
    return newlines + (0 if ends_with_newline else 1)


def _validate_jsonl(path: Path, name: str, max_depth: int) -> tuple[int, int, int]:
    """(records, their text's UTF-8 bytes plus one EOS each, the same of what trains)."""
    n_records = max_tokens = trained = 0
    offset = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise DataError(
                    f"line {n} is over {MAX_LINE_BYTES >> 20} MiB: split the record into several "
                    "(one JSON object per line)",
                    n,
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise not_utf8(offset + e.start, n, e) from e
            if (document := parse_jsonl_line(text, n, max_depth)) is not None:
                n_records += 1
                for text, is_trained in document.segments:  # each segment encoded once
                    size = len(text.encode("utf-8"))
                    max_tokens += size
                    trained += size if is_trained else 0
                max_tokens += 1  # the EOS
                trained += document.eos_trained
            offset += len(raw)
    if n_records == 0:
        raise DataError(f"{name} has no JSONL records (only blank lines); {SHAPES_HELP}")
    return n_records, max_tokens, trained


def split_point(buf: str) -> int:
    """Where to cut `buf` so the next chunk starts at a pre-tokenization boundary (0 = nowhere), the
    last such point of the first kind found: right after a newline between two non-space characters;
    right before a space between two; right before the newline that ends a longer run of whitespace
    followed by a non-space. Never after such a run: GPT-2's `\\s+(?!\\S)` splits it before its last
    character, so a piece ending with the whole run would tokenize differently."""
    return _after_lone_newline(buf) or _before_lone_space(buf) or _before_run_end(buf)


def _after_lone_newline(buf: str) -> int:
    i = len(buf) - 1  # the cut needs a following character to look at
    while (nl := buf.rfind("\n", 0, i)) >= 0:
        if not buf[nl + 1].isspace() and (nl == 0 or not buf[nl - 1].isspace()):
            return nl + 1
        i = nl
    return 0


def _before_lone_space(buf: str) -> int:
    i = len(buf) - 1
    while (sp := buf.rfind(" ", 1, i)) >= 0:
        if not buf[sp - 1].isspace() and not buf[sp + 1].isspace():
            return sp
        i = sp
    return 0


def _before_run_end(buf: str) -> int:
    i = len(buf) - 1
    while (nl := buf.rfind("\n", 1, i)) >= 0:
        if not buf[nl + 1].isspace() and buf[nl - 1].isspace():
            return nl
        i = nl
    return 0


def iter_text_chunks(path: str | os.PathLike[str], chunk_chars: int = DEFAULT_CHUNK_CHARS) -> Iterator[str]:
    """A text file as chunks of about `chunk_chars` characters cut at whitespace boundaries
    (see the module docstring); their concatenation is the file's text (minus a leading BOM)."""
    carry = ""
    with open(path, encoding="utf-8-sig", newline="") as f:
        while True:
            new = f.read(chunk_chars)
            buf = carry + new
            if not new:
                if buf:
                    yield buf
                return
            cut = split_point(buf)
            if cut == 0:
                if len(buf) < 4 * chunk_chars:
                    carry = buf  # no boundary yet: read on
                    continue
                cut = len(buf)  # a huge run without whitespace: hard cut to keep memory bounded
            carry = buf[cut:]
            yield buf[:cut]


def iter_documents(path: str | os.PathLike[str], chunk_chars: int = DEFAULT_CHUNK_CHARS) -> Iterator[str]:
    """Text: the file as one document, in chunks. JSONL: one document per record.

    Bad records raise DataError naming the line; so does bad UTF-8 (with its byte offset)."""
    try:
        if detect_format(path) == "text":
            yield from iter_text_chunks(path, chunk_chars)
            return
        # newline="\n": split lines exactly where validate_file does (a lone "\r" is not a line end).
        with open(path, encoding="utf-8", newline="\n") as f:
            for doc in iter_jsonl_documents(f):
                yield doc.text
    except UnicodeDecodeError:
        validate_file(path)  # rescan to report the byte offset and line as a DataError
        raise
