"""How a hyperparameter is declared: `param(...)` (default, help, bounds, form hints), the strict
pydantic base of both configs, and the field types JSON needs (an integral float is an integer; a
list of choices is a set)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from trainer.config.errors import ConfigError, problems_from_validation

INT64_MAX = 2**63 - 1


def _integral(value: Any) -> Any:
    """JSON has one number type: accept 5.0 where an integer is expected (never True/False)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= INT64_MAX:
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]


def _distinct(values: list[Any]) -> list[Any]:
    """A list field of choices is a set: each choice at most once (kept in the order given)."""
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
        raise ValueError(f"names {twice[0]!r} twice")
    return values


# A list field's items are a Literal's choices, each at most once (trainer.config.schema: kind "list").
Distinct = AfterValidator(_distinct)


def param(
    default: Any,
    help: str,
    *,
    title: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    null_means: str | None = None,
    advanced: bool = True,
    accepts_auto: bool = False,
    in_job: bool = True,
    in_cli: bool = True,
) -> Any:
    """A config field: its default, one-line help, short form label (title), bounds and hints.

    null_means: what leaving it unset means (fields whose default is None).
    advanced: shown under "Advanced" in the dashboard's form.
    accepts_auto: the API also accepts OpenAI's "auto" (= the default).
    in_job / in_cli: False for a field that is not a job hyperparameter / not a `fromscratch train` option.
    """
    extra: dict[str, Any] = {"x-advanced": advanced}
    if null_means is not None:
        extra["x-null-means"] = null_means
    if accepts_auto:
        extra["x-accepts-auto"] = True
    if not in_job:
        extra["x-in-job"] = False
    if not in_cli:
        extra["x-in-cli"] = False
    return Field(default, title=title, description=help, ge=ge, gt=gt, le=le, lt=lt, json_schema_extra=extra)


class StrictConfig(BaseModel):
    """Strict validation, unknown fields refused, every problem reported as one ConfigError."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, validate_default=False)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ConfigError(problems_from_validation(err, type(self).__name__)) from None
        problems = self._cross_field_problems()
        if problems:
            raise ConfigError(problems)

    def _cross_field_problems(self) -> list[tuple[str, str]]:
        return []

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()
