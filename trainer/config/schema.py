"""Everything derived from the config declarations in trainer.config (the one schema):

- `fields()`: one `Hyperparameter` per declared field, in declaration order (model, then training);
- `add_options()`: the argparse options of `fromscratch train` and `fromscratch jobs create`;
- `json_schema()`: the JSON Schema of a job's `hyperparameters` (GET /v1/fine_tuning/hyperparameters),
  which the dashboard renders its new-job form from.

Kinds: int, float, bool, choice (a `Literal`) and list (`Annotated[list[Literal[...]], Distinct]`: a
set of choices; on a command line comma-separated, `none` for the empty list; in JSON an array of
the enum; in the form one checkbox per choice).

Nothing here names a particular field except OpenAI's `learning_rate_multiplier` (an API alias that
scales `learning_rate`; it has no trainer field). Import-light: no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

import annotated_types
from pydantic import Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from trainer.config import DEFAULT_PRESET, PRESETS, ModelConfig, TrainConfig, model_config_from_preset
from trainer.config.errors import ConfigError, problems_from_validation
from trainer.config.train import group_of

Section = Literal["model", "train"]
Kind = Literal["int", "float", "bool", "choice", "list"]  # list: a set of a Literal's choices

# OpenAI's multiplier of the default learning rate: accepted by the API and `jobs create` only.
LEARNING_RATE_MULTIPLIER = "learning_rate_multiplier"
# Training fields a run continuing a checkpoint takes from it, with the architecture (`from_source`)
TOKENIZER_FIELDS = ("tokenizer", "vocab_size")


@dataclass(frozen=True)
class Hyperparameter:
    name: str
    section: Section  # model = architecture (its default comes from the preset)
    group: str  # the concern it belongs to: model, or a TrainConfig group (trainer.config.train.TRAIN_GROUPS)
    kind: Kind
    choices: tuple[str, ...] | None
    nullable: bool
    default: Any  # model fields: the default preset's value
    title: str
    help: str
    bounds: dict[str, float]  # JSON Schema keywords: minimum, maximum, exclusiveMinimum, exclusiveMaximum
    null_means: str | None
    advanced: bool
    accepts_auto: bool
    in_job: bool
    in_cli: bool

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def from_source(self) -> bool:
        """Set by the checkpoint a run continues (the architecture and the tokenizer): refused there."""
        return self.section == "model" or self.name in TOKENIZER_FIELDS

    @property
    def python_type(self) -> type:
        return {"int": int, "float": float, "bool": bool, "choice": str, "list": list}[self.kind]


def _kind(annotation: Any) -> tuple[Kind, tuple[str, ...] | None, bool]:
    """(kind, choices, nullable) of a field annotation such as `Int | None` or `Literal["a", "b"]`."""
    args = get_args(annotation) if get_origin(annotation) is not Literal else ()
    nullable = type(None) in args
    if nullable:
        annotation = next(a for a in args if a is not type(None))
    if get_origin(annotation) is Literal:
        return "choice", tuple(get_args(annotation)), nullable
    if get_origin(annotation) is list:  # list[Literal[...]]: any of the choices, each at most once
        return "list", tuple(get_args(get_args(annotation)[0])), nullable
    base = get_args(annotation)[0] if get_args(annotation) else annotation  # Annotated[int, ...] -> int
    kind: Kind = {bool: "bool", int: "int", float: "float"}[base]  # type: ignore[assignment]
    return kind, None, nullable


_BOUND_KEYWORDS = {
    annotated_types.Ge: ("ge", "minimum"),
    annotated_types.Gt: ("gt", "exclusiveMinimum"),
    annotated_types.Le: ("le", "maximum"),
    annotated_types.Lt: ("lt", "exclusiveMaximum"),
}


def _bounds(info: FieldInfo) -> dict[str, float]:
    bounds: dict[str, float] = {}
    for item in info.metadata:
        for cls, (attr, keyword) in _BOUND_KEYWORDS.items():
            if isinstance(item, cls):
                bounds[keyword] = getattr(item, attr)
    return bounds


def _field(name: str, info: FieldInfo, section: Section, group: str, default: Any) -> Hyperparameter:
    kind, choices, nullable = _kind(info.annotation)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return Hyperparameter(
        name=name,
        section=section,
        group=group,
        kind=kind,
        choices=choices,
        nullable=nullable,
        default=default,
        title=info.title or name,
        help=info.description or name,
        bounds=_bounds(info),
        null_means=extra.get("x-null-means"),  # type: ignore[arg-type]
        advanced=bool(extra.get("x-advanced", True)),
        accepts_auto=bool(extra.get("x-accepts-auto", False)),
        in_job=bool(extra.get("x-in-job", True)),
        in_cli=bool(extra.get("x-in-cli", True)),
    )


def fields() -> list[Hyperparameter]:
    """Every declared config field: architecture first, then training group by group."""
    preset = model_config_from_preset(DEFAULT_PRESET)
    out = [_field(n, f, "model", "model", getattr(preset, n)) for n, f in ModelConfig.model_fields.items()]
    out += [_field(n, f, "train", group_of(n), f.default) for n, f in TrainConfig.model_fields.items()]
    return out


def learning_rate_multiplier() -> Hyperparameter:
    return Hyperparameter(
        name=LEARNING_RATE_MULTIPLIER,
        section="train",
        group="optimizer",
        kind="float",
        choices=None,
        nullable=False,
        default=1.0,
        title="Learning-rate multiplier",
        help="OpenAI's multiplier of the learning rate (the job trains at learning_rate x this)",
        bounds={"exclusiveMinimum": 0, "maximum": 1000},
        null_means=None,
        advanced=True,
        accepts_auto=True,
        in_job=True,
        in_cli=False,
    )


def check_value(h: Hyperparameter, value: Any) -> Any:
    """`value` validated against h's type and bounds (for a field that has no config class, i.e.
    learning_rate_multiplier); ConfigError naming h otherwise."""
    b = h.bounds
    bounded = Field(
        strict=True,
        allow_inf_nan=False,
        ge=b.get("minimum"),
        gt=b.get("exclusiveMinimum"),
        le=b.get("maximum"),
        lt=b.get("exclusiveMaximum"),
    )
    adapter: TypeAdapter[Any] = TypeAdapter(Annotated[h.python_type, bounded])  # type: ignore[arg-type]
    try:
        return adapter.validate_python(value)
    except ValidationError as err:
        raise ConfigError(problems_from_validation(err, h.name)) from None


def job_hyperparameters() -> list[Hyperparameter]:
    """What a job's `hyperparameters` accepts (and `fromscratch jobs create` offers); OpenAI's
    learning_rate_multiplier next to the learning rate it scales."""
    accepted: list[Hyperparameter] = []
    for h in fields():
        if h.in_job:
            accepted.append(h)
        if h.name == "learning_rate":
            accepted.append(learning_rate_multiplier())
    return accepted


def cli_options() -> list[Hyperparameter]:
    """The config options of `fromscratch train`."""
    return [h for h in fields() if h.in_cli]


# ------------------------------------------------------------------------------------ CLI options
def shown_value(value: Any) -> str:
    """A value as a command line takes it: a list as comma-separated choices (`none` when empty)."""
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def default_text(h: Hyperparameter) -> str:
    if h.section == "model":
        shown = h.null_means if h.default is None else h.default
        return f"from the preset; {DEFAULT_PRESET}: {shown}"
    if h.default is None:
        return f"unset = {h.null_means}" if h.null_means else "unset"
    return shown_value(h.default)


def _number(kind: type, auto: bool) -> Callable[[str], Any]:
    """argparse type for a number option; `auto` also accepts the word auto (OpenAI's value)."""

    def parse(text: str) -> Any:
        return "auto" if auto and text == "auto" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def _choice_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """argparse type of a list option: comma-separated choices (`gguf,hf`); `none` or an empty
    value is the empty list. A repeated choice is left for the config to refuse, naming the field."""

    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if items == ["none"]:
            return []
        unknown = [item for item in items if item not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"{unknown[0]!r} is not one of {', '.join(choices)} (comma-separated; none for no items)"
            )
        return items

    parse.__name__ = "list"
    return parse


def add_options(
    groups: dict[str, Any],
    hyperparameters: list[Hyperparameter],
    *,
    by: Literal["section", "group"] = "section",
    dest_prefix: str = "",
    default: Any = argparse.SUPPRESS,
    accept_auto: bool = False,
) -> None:
    """One option `--x-y` per hyperparameter `x_y`, added to groups[its section] (or its group).

    An option not given is `default` in the namespace (SUPPRESS: absent), so callers send or apply
    only what the user typed. accept_auto: numbers marked accepts_auto also take the word auto."""
    for h in hyperparameters:
        kwargs: dict[str, Any] = {"dest": dest_prefix + h.name, "default": default}
        help_text = f"{h.help} (default: {default_text(h)})".replace("%", "%%")
        if h.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif h.kind == "choice":
            assert h.choices is not None
            kwargs.update(choices=list(h.choices), metavar="|".join(h.choices))
        elif h.kind == "list":
            assert h.choices is not None
            kwargs.update(type=_choice_list(h.choices), metavar=",".join(h.choices))
        else:
            kwargs.update(type=_number(h.python_type, accept_auto and h.accepts_auto), metavar=h.kind.upper())
        groups[getattr(h, by)].add_argument(h.option, help=help_text, **kwargs)


# ------------------------------------------------------------------------------------ JSON Schema
def _property(h: Hyperparameter) -> dict[str, Any]:
    json_type = {"int": "integer", "float": "number", "bool": "boolean", "choice": "string", "list": "array"}[
        h.kind
    ]
    prop: dict[str, Any] = {
        "title": h.title,
        "description": h.help,
        "type": [json_type, "null"] if h.nullable else json_type,
        **h.bounds,
        "default": h.default,
        "x-kind": h.kind,
        "x-section": h.section,
        "x-group": h.group,
        "x-advanced": h.advanced,
        "x-option": h.option,
    }
    if h.kind == "list":
        assert h.choices is not None
        prop |= {"items": {"type": "string", "enum": list(h.choices)}, "uniqueItems": True}
    elif h.choices is not None:
        prop["enum"] = list(h.choices)
    if h.null_means is not None:
        prop["x-null-means"] = h.null_means
    if h.accepts_auto:
        # OpenAI's "auto" (= the default) is a valid value too
        prop = {"anyOf": [{k: v for k, v in prop.items() if k in _TYPE_KEYS}, {"const": "auto"}]} | {
            k: v for k, v in prop.items() if k not in _TYPE_KEYS
        }
        prop["x-accepts-auto"] = True
    return prop


_TYPE_KEYS = {
    "type",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "items",
    "uniqueItems",
}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a job's `hyperparameters`, with the presets a job's `model` may name."""
    presets = {name: model_config_from_preset(name).to_dict() for name in PRESETS}
    for values in presets.values():
        values.pop("vocab_size", None)  # follows the tokenizer
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Hyperparameters",
        "description": "The hyperparameters a fine-tuning job accepts. Architecture fields (x-section "
        "model) override the preset named by the job's `model`; a job's seed is the request's "
        "top-level `seed`.",
        "type": "object",
        "additionalProperties": False,
        "properties": {h.name: _property(h) for h in job_hyperparameters()},
        "x-presets": presets,
        "x-default-preset": DEFAULT_PRESET,
    }
