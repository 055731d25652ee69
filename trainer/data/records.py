"""One JSONL record -> a `Document`: its text in segments, each marked with whether the loss covers
it (see trainer.data.formats's docstring for the shapes and the masking rules). Torch-free and
numpy-free: the API validates uploads with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainer.data.chat import ASSISTANT, CHAT_ROLES, ROLE_ALIASES, canonical_role, role_header
from trainer.data.errors import DataError

SHAPES_HELP = (
    'each line must be a JSON object with "text" (string), or "prompt" and "completion" '
    '(strings), or "messages" (a list of {"role": string, "content": string})'
)


@dataclass(frozen=True)
class Document:
    """A rendered record: `segments` of (text, trained) with adjacent marks never equal, and whether
    the EOS that follows the document is trained."""

    segments: tuple[tuple[str, bool], ...]
    eos_trained: bool

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.segments)


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _quote(text: str, limit: int = 40) -> str:
    """A user's string in a message, cut short (an error must not echo a huge value)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _document(pieces: list[tuple[str, bool]], eos_trained: bool) -> Document:
    """Join adjacent pieces with the same mark; drop empty ones."""
    segments: list[tuple[str, bool]] = []
    for text, trained in pieces:
        if not text:
            continue
        if segments and segments[-1][1] == trained:
            segments[-1] = (segments[-1][0] + text, trained)
        else:
            segments.append((text, trained))
    return Document(tuple(segments), eos_trained)


SHAPE_KEYS = {
    '"messages"': ("messages",),
    '"prompt"/"completion"': ("prompt", "completion"),
    '"text"': ("text",),
}


def record_to_document(record: Any, line: int | None = None) -> Document:
    """One JSONL record -> its Document; DataError (naming `line`) for unknown or broken shapes."""
    where = f"line {line}: " if line is not None else ""
    if not isinstance(record, dict):
        raise DataError(f"{where}expected a JSON object, got {type_name(record)}; {SHAPES_HELP}", line)
    shapes = [s for s, keys in SHAPE_KEYS.items() if any(k in record for k in keys)]
    if len(shapes) > 1:  # which one the user meant is not for us to pick (the others would be dropped)
        raise DataError(f"{where}the record has {' and '.join(shapes)}: a record is one of them", line)
    if "messages" in record:
        return _chat_document(record["messages"], where, line)
    if "prompt" in record or "completion" in record:
        for key in ("prompt", "completion"):
            if key not in record:
                raise DataError(f'{where}"{key}" is missing (prompt/completion records need both)', line)
            if not isinstance(record[key], str):
                raise DataError(
                    f'{where}"{key}" must be a string (prompt/completion records need both), '
                    f"got {type_name(record[key])}",
                    line,
                )
        return _document([(record["prompt"], False), (record["completion"], True)], eos_trained=True)
    if "text" in record:
        if not isinstance(record["text"], str):
            raise DataError(f'{where}"text" must be a string, got {type_name(record["text"])}', line)
        return _document([(record["text"], True)], eos_trained=True)
    keys = ", ".join(sorted(record)) or "none"
    raise DataError(f"{where}record has none of the accepted keys (it has: {keys}); {SHAPES_HELP}", line)


def _chat_document(messages: Any, where: str, line: int | None) -> Document:
    if not isinstance(messages, list) or not messages:
        raise DataError(
            f'{where}"messages" must be a non-empty list of {{"role", "content"}} objects, '
            f"got {'an empty list' if messages == [] else type_name(messages)}",
            line,
        )
    pieces: list[tuple[str, bool]] = []
    trained = False
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(
                f'{where}messages[{i}] must be an object with "role" and "content", got {type_name(m)}', line
            )
        if "role" not in m:
            raise DataError(f"{where}messages[{i}].role is missing; it must be a string", line)
        role = m["role"]
        if not isinstance(role, str):
            raise DataError(f"{where}messages[{i}].role must be a string, got {type_name(role)}", line)
        role = canonical_role(role)
        if role not in CHAT_ROLES:
            roles = ", ".join(f'"{r}"' for r in (*CHAT_ROLES, *ROLE_ALIASES))
            raise DataError(f"{where}messages[{i}].role must be one of {roles}, got {_quote(role)}", line)
        content = message_content(m, f"{where}messages[{i}]", line)
        weight = _weight(m, role, f"{where}messages[{i}]", line)
        trained = role == ASSISTANT and weight
        pieces += [(role_header(role), False), (content + "\n", trained)]
    # the EOS closes the last message: trained when that message is a trained assistant turn
    return _document(pieces, eos_trained=trained)


def message_content(m: dict[str, Any], where: str, line: int | None) -> str:
    """A message's content as text: a string, or OpenAI's text parts joined."""
    if "content" not in m:
        raise DataError(f"{where}.content is missing; it must be a string or a list of text parts", line)
    content = m["content"]
    if isinstance(content, str):
        return content
    if content is None:
        raise DataError(
            f"{where}.content must be a string or a list of text parts, got null (a message without text, "
            "such as an assistant's tool call, cannot be trained on: tools are not supported)",
            line,
        )
    if not isinstance(content, list):
        raise DataError(
            f"{where}.content must be a string or a list of text parts, got {type_name(content)}", line
        )
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise DataError(
                f'{at} must be an object {{"type": "text", "text": string}}, got {type_name(part)}', line
            )
        if "type" not in part:
            raise DataError(f'{at}.type is missing; a text part is {{"type": "text", "text": string}}', line)
        if part["type"] != "text":
            kind = part["type"]
            shown = _quote(kind) if isinstance(kind, str) else type_name(kind)
            raise DataError(f'{at}.type must be "text" (only text parts are supported), got {shown}', line)
        if "text" not in part:
            raise DataError(f"{at}.text is missing; it must be a string", line)
        if not isinstance(part["text"], str):
            raise DataError(f"{at}.text must be a string, got {type_name(part['text'])}", line)
        texts.append(part["text"])
    return "".join(texts)


def _weight(m: dict[str, Any], role: str, where: str, line: int | None) -> bool:
    """OpenAI's per-message `weight`: 0 or 1 on assistant messages (1 when absent)."""
    if "weight" not in m:
        return True
    w = m["weight"]
    if role != ASSISTANT:
        raise DataError(
            f"{where}.weight is only allowed on assistant messages (this one is {_quote(role)})", line
        )
    if isinstance(w, bool) or not isinstance(w, (int, float)) or w not in (0, 1):
        shown = json.dumps(w) if isinstance(w, (bool, int, float)) else type_name(w)
        raise DataError(f"{where}.weight must be 0 or 1, got {shown}", line)
    return w == 1
