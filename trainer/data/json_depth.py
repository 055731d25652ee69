"""JSON parsed with a bound on its nesting. Python's json module recurses once per level, so a line
of 1,000 `[` used to be a RecursionError out of the parser (a 500 in the service), not a message.
`loads_bounded(text, limit)` parses with json.loads and raises TooDeep when the document nests more
than `limit` arrays/objects inside one another, or so deep that the parser ran out of stack. Every
JSON text a user sends goes through it: JSONL records (trainer.data.formats) and request bodies
(api/request_text.py, with the service's setting FROMSCRATCH_MAX_JSON_DEPTH)."""

from __future__ import annotations

import json
from typing import Any

# The deepest JSON accepted anywhere, well below Python's recursion limit (1,000 frames, the
# caller's included); the service sets a lower bound of its own (FROMSCRATCH_MAX_JSON_DEPTH).
MAX_JSON_DEPTH = 500


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested more than {limit} levels deep")
        self.limit = limit


def loads_bounded(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads(text), or TooDeep (json.JSONDecodeError for text that is not JSON)."""
    try:
        document = json.loads(text)
    except RecursionError:  # the C parser's own bound on nesting: deeper than any limit here
        raise TooDeep(limit) from None
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
