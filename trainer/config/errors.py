"""ConfigError: every invalid field of a config at once, each named, in words a user acts on.

Pydantic's messages are turned into the project's own ("must be positive, got 0", "must be one of
a, b; got 'c'") so the CLI, the API and the dashboard say the same thing whichever way a value came.
"""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import ErrorDetails

# How much of a user's value an error message quotes (a 1 MB string is not echoed back).
MAX_QUOTED = 80


class ConfigError(ValueError):
    """One or more invalid fields. `problems` is a list of (field_name, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{name}: {msg}" for name, msg in problems))

    @property
    def param(self) -> str:
        """The first offending field (what the API reports as `error.param`)."""
        return self.problems[0][0]


def quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."


def _message(error: ErrorDetails, what: str) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = quote(error.get("input"))
    if kind in ("greater_than", "greater_than_equal"):
        bound = ctx.get("gt", ctx.get("ge"))
        if bound == 0 and kind == "greater_than" or bound == 1 and isinstance(error.get("input"), int):
            return f"must be positive, got {got}"
        return f"must be {'>' if kind == 'greater_than' else '>='} {bound}, got {got}"
    if kind in ("less_than", "less_than_equal"):
        bound = ctx.get("lt", ctx.get("le"))
        return f"must be {'<' if kind == 'less_than' else '<='} {bound}, got {got}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '').replace(' or ', ', ')}; got {got}"
    if kind.startswith("int_"):
        return f"must be an integer, got {got}"
    if kind.startswith("float_") or kind == "finite_number":
        return f"must be a finite number, got {got}"
    if kind.startswith("bool_"):
        return f"must be true or false, got {got}"
    if kind == "list_type":
        return f"must be a list, got {got}"
    if kind == "value_error":  # a validator's own ValueError: its message is already in words
        return str(ctx.get("error", error["msg"]))
    if kind == "extra_forbidden":
        return f"unknown {what} field"
    return str(error["msg"])


def problems_from_validation(err: ValidationError, model_name: str) -> list[tuple[str, str]]:
    what = {"ModelConfig": "model config", "TrainConfig": "train config"}.get(model_name, model_name)
    problems: list[tuple[str, str]] = []
    for error in err.errors():
        name = str(error["loc"][0]) if error["loc"] else model_name
        problems.append((name, _message(error, what)))
    return problems
