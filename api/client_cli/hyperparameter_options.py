"""The job hyperparameter options of `fromscratch jobs create`, generated from trainer.config so
their names, types, choices and defaults match `fromscratch train`."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

from trainer.config import MODEL_FIELDS, PRESETS, ModelConfig, TrainConfig

# TrainConfig fields that are not job options.
_NOT_JOB_OPTIONS = {"extra"}
# OpenAI's hyperparameters that also accept "auto".
_AUTO_OK = {"n_epochs", "batch_size"}
# What a None default means (the rules live in TrainConfig's resolved_* properties).
_NONE_MEANS = {
    "vocab_size": "258 for byte, 4096 for bpe",
    "max_steps": "1000 steps unless --n-epochs is given",
    "n_epochs": "none: --max-steps decides",
    "min_lr": "learning_rate / 10",
    "warmup_steps": "min(100, total_steps / 10)",
    "cos_decay_steps": "total steps",
    "time_limit": "none",
}


def _base_type(tp: Any) -> tuple[type, tuple[Any, ...] | None]:
    """(python type, choices) for a dataclass field annotation like `int | None` or Literal[...]."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return _base_type(args[0])
    if typing.get_origin(tp) is typing.Literal:
        return str, tuple(typing.get_args(tp))
    return tp, None


def _auto_or(kind: type) -> Callable[[str], Any]:
    """A parser for a number option that also accepts the word auto."""
    def parse(text: str) -> Any:
        return "auto" if text == "auto" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def hyperparameter_specs() -> list[dict[str, Any]]:
    """One entry per job hyperparameter option: name, python type, choices, default, help.
    Names and defaults come from trainer.config, so they match `fromscratch train`."""
    specs: list[dict[str, Any]] = []
    model_hints = typing.get_type_hints(ModelConfig)
    for name in MODEL_FIELDS:
        kind, choices = _base_type(model_hints[name])
        tiny = PRESETS["llama-tiny"].get(name)
        default_text = "from the preset" + (f" (llama-tiny: {tiny})" if tiny is not None else "")
        specs.append(dict(name=name, kind=kind, choices=choices, default_text=default_text, group="model"))
    train_hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        if f.name in _NOT_JOB_OPTIONS or f.name == "seed":
            continue  # seed is the job's top-level `seed`
        kind, choices = _base_type(train_hints[f.name])
        default = f.default if f.default is not MISSING else None
        specs.append(dict(name=f.name, kind=kind, choices=choices, group="train",
                          default_text=_NONE_MEANS.get(f.name, "none") if default is None else f"{default}"))
    return specs


def add_hyperparameter_options(parser: argparse.ArgumentParser) -> None:
    """Add one option per hyperparameter spec (dest hp_NAME, default None = not sent)."""
    groups = {
        "model": parser.add_argument_group("architecture (override the preset; only the options given are sent)"),
        "train": parser.add_argument_group("training hyperparameters (as in `fromscratch train`; "
                                           "only the options given are sent)"),
    }
    for spec in hyperparameter_specs():
        name, kind = spec["name"], spec["kind"]
        flag = "--" + name.replace("_", "-")
        group = groups[spec["group"]]
        help_text = f"default: {spec['default_text']}"
        dest = "hp_" + name
        if kind is bool:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                               help=help_text)
        elif spec["choices"]:
            group.add_argument(flag, dest=dest, choices=spec["choices"], default=None, help=help_text)
        else:
            parse = _auto_or(kind) if name in _AUTO_OK else kind
            group.add_argument(flag, dest=dest, type=parse, default=None,
                               metavar=name.upper(), help=help_text)
    groups["train"].add_argument("--learning-rate-multiplier", dest="hp_learning_rate_multiplier",
                                 type=_auto_or(float), default=None, metavar="X",
                                 help="OpenAI's multiplier of the default learning rate, or auto")


def hyperparameters_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The hyperparameters given on the command line, as the job request's dict."""
    return {key[3:]: value for key, value in vars(args).items() if key.startswith("hp_") and value is not None}
