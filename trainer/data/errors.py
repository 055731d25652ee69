"""`DataError`: unusable training data, with where it is (torch-free; trainer.data.formats re-exports it)."""

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
