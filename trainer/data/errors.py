"""`DataError`: unusable training data, with where it is (torch-free; trainer.data.formats re-exports
it), and what is said of a file that is not UTF-8 text."""

from __future__ import annotations


class DataError(ValueError):
    """Unusable training data. `line` is the 1-based line (None when not about one line);
    `offset` the byte offset for encoding errors; `validation`: about the validation data (its own
    file, or what val_fraction split off), not the training data."""

    def __init__(
        self, message: str, line: int | None = None, *, offset: int | None = None, validation: bool = False
    ):
        super().__init__(message)
        self.message = message
        self.line = line
        self.offset = offset
        self.validation = validation


class JSONTooDeep(DataError):
    """A JSON record nested deeper than `limit` arrays/objects (trainer.data.json_depth)."""

    def __init__(self, line: int, limit: int):
        super().__init__(f"line {line}: the JSON is nested more than {limit} levels deep", line)
        self.limit = limit


# What a file that is not UTF-8 text starts with, named so that the fix is plain
NOT_UTF8_SIGNATURES = {
    b"\xff\xfe": "UTF-16 text (little-endian: it starts with the byte-order mark FF FE); convert it to "
    "UTF-8 (iconv -f UTF-16 -t UTF-8, or save it as UTF-8)",
    b"\xfe\xff": "UTF-16 text (big-endian: it starts with the byte-order mark FE FF); convert it to "
    "UTF-8 (iconv -f UTF-16 -t UTF-8, or save it as UTF-8)",
    b"\x1f\x8b": "gzip-compressed; decompress it (gunzip) and upload the text",
    b"PK\x03\x04": "a zip archive; unpack it and upload the text file",
}


def not_utf8(offset: int, line: int, exc: UnicodeDecodeError) -> DataError:
    return DataError(
        f"not UTF-8 text: invalid byte 0x{exc.object[exc.start]:02x} at byte offset {offset} "
        f"(line {line}); binary files are not accepted, convert the text to UTF-8 (text in another "
        "encoding, e.g. Windows-1252: iconv -f CP1252 -t UTF-8)",
        line,
        offset=offset,
    )
