"""JSON a user sent, parsed with bounds. Python's json module recurses once per level, so a line of
1,000 `[` used to be a RecursionError out of the parser (a 500 in the service), not a message.
`loads_bounded(text, limit)` parses with json.loads and raises TooDeep when the document nests more
than `limit` arrays/objects inside one another, or so deep that the parser ran out of stack, and
NumberTooLong for an integer past Python's digit limit (a plain ValueError out of json.loads).
Every JSON text a user sends goes through it: JSONL records (trainer.data.formats) and request
bodies (api/request_text.py, with the service's setting FROMSCRATCH_MAX_JSON_DEPTH).

`first_string_where` finds the first string (keys included) a check refuses, with its path: a lone
surrogate (`"\\ud800"`) parses as a `str` that no UTF-8 encoder takes, so it must be refused where
the text arrives, naming where it is."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
JSONPath = tuple[str | int, ...]

# The deepest JSON accepted anywhere, well below Python's recursion limit (1,000 frames, the
# caller's included); the service sets a lower bound of its own (FROMSCRATCH_MAX_JSON_DEPTH).
MAX_JSON_DEPTH = 500


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested more than {limit} levels deep")
        self.limit = limit


class NumberTooLong(ValueError):
    def __init__(self) -> None:
        self.digits = sys.get_int_max_str_digits()
        super().__init__(f"an integer of more than {self.digits} digits")


def loads_bounded(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads(text), or TooDeep, or NumberTooLong (json.JSONDecodeError for text that is not
    JSON)."""
    try:
        document = json.loads(text)
    except RecursionError:  # the C parser's own bound on nesting: deeper than any limit here
        raise TooDeep(limit) from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # int() past sys.get_int_max_str_digits(), the only other ValueError
        raise NumberTooLong() from None
    if isinstance(text, bytes):
        opened = text.count(b"[") + text.count(b"{")
    else:
        opened = text.count("[") + text.count("{")
    if opened > limit and nested_deeper(document, limit):  # cannot nest deeper than it opens
        raise TooDeep(limit)
    return document


def nested_deeper(value: Any, limit: int) -> bool:
    """True when `value` (parsed JSON) holds arrays/objects more than `limit` levels deep."""
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:  # iterative: the document may be as deep as the parser allows
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def first_string_where(document: object, bad: Callable[[str], bool]) -> tuple[JSONPath, str] | None:
    """(path, the string) of the first string in `document` (keys included) that `bad` refuses, in
    document order; the path of a bad key is that of the object holding it."""
    stack: list[tuple[JSONPath, object]] = [((), document)]
    while stack:  # iterative: a deeply nested document must not exhaust the stack
        path, value = stack.pop()
        if isinstance(value, str):
            if bad(value):
                return path, value
        elif isinstance(value, dict):
            for key in value:
                if bad(key):
                    return path, key
            stack.extend((path + (key,), item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((path + (i,), item) for i, item in reversed(list(enumerate(value))))
    return None


def has_lone_surrogate(text: str) -> bool:
    return LONE_SURROGATE.search(text) is not None
