"""The job hyperparameter options of `fromscratch jobs create`, generated from trainer.config so
their names, types, choices and defaults match `fromscratch train`."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

from trainer.config import FIELD_HELP, MODEL_FIELDS, PRESETS, ModelConfig, TrainConfig, field_type

# TrainConfig fields that are not job options.
_NOT_JOB_OPTIONS = {"extra"}
# OpenAI's hyperparameters that also accept "auto".
_AUTO_OK = {"n_epochs", "batch_size"}


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
        kind, choices = field_type(model_hints[name])
        tiny = PRESETS["llama-tiny"].get(name)
        default_text = "from the preset" + (f" (llama-tiny: {tiny})" if tiny is not None else "")
        specs.append(dict(name=name, kind=kind, choices=choices, default_text=default_text, group="model"))
    train_hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        if f.name in _NOT_JOB_OPTIONS or f.name == "seed":
            continue  # seed is the job's top-level `seed`
        kind, choices = field_type(train_hints[f.name])
        default = f.default if f.default is not MISSING else None
        specs.append(
            dict(
                name=f.name,
                kind=kind,
                choices=choices,
                group="train",
                default_text="unset" if default is None else f"{default}",
            )
        )
    return specs


def add_hyperparameter_options(parser: argparse.ArgumentParser) -> None:
    """Add one option per hyperparameter spec (dest hp_NAME, default None = not sent)."""
    groups = {
        "model": parser.add_argument_group(
            "architecture (override the preset; only the options given are sent)"
        ),
        "train": parser.add_argument_group(
            "training hyperparameters (as in `fromscratch train`; only the options given are sent)"
        ),
    }
    for spec in hyperparameter_specs():
        name, kind = spec["name"], spec["kind"]
        flag = "--" + name.replace("_", "-")
        group = groups[spec["group"]]
        help_text = f"{FIELD_HELP.get(name, name)} (default: {spec['default_text']})"
        dest = "hp_" + name
        if kind is bool:
            group.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif spec["choices"]:
            group.add_argument(flag, dest=dest, choices=spec["choices"], default=None, help=help_text)
        else:
            parse = _auto_or(kind) if name in _AUTO_OK else kind
            group.add_argument(
                flag, dest=dest, type=parse, default=None, metavar=name.upper(), help=help_text
            )
    groups["train"].add_argument(
        "--learning-rate-multiplier",
        dest="hp_learning_rate_multiplier",
        type=_auto_or(float),
        default=None,
        metavar="X",
        help="OpenAI's multiplier of the default learning rate, or auto",
    )


def hyperparameters_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The hyperparameters given on the command line, as the job request's dict."""
    return {
        key[3:]: value for key, value in vars(args).items() if key.startswith("hp_") and value is not None
    }
