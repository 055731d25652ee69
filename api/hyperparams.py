"""A job request's hyperparameters -> (ModelConfig, TrainConfig), validated by trainer.config itself,
so `fromscratch train` and `POST /v1/fine_tuning/jobs` accept and reject exactly the same values.

What a job accepts is trainer.config.schema.job_hyperparameters() (served as JSON Schema at
GET /v1/fine_tuning/hyperparameters): every architecture field of ModelConfig (overriding the preset
named by `model`), every training field of TrainConfig except `seed` (the request's top-level
`seed`), and OpenAI's `learning_rate_multiplier`. OpenAI's "auto" is accepted where the schema says
so (`n_epochs`, `batch_size`, `learning_rate_multiplier`) and means the default.

When continuing training from an earlier model (`model` = a model id), the architecture and the
tokenizer come from that model: architecture fields, `tokenizer` and `vocab_size` are refused unless
they equal the model's.

An invalid hyperparameter is reported with `param` = the bare field name (`"n_embd"`, or the unknown
name itself), as OpenAI's API does (`"param": "n_epochs"`), whether the hyperparameters came top-level
or under `method.supervised.hyperparameters`; it is also the name a user types on the CLI (with dashes).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from trainer.config import (
    DEFAULT_PRESET,
    PRESETS,
    ConfigError,
    ModelConfig,
    TrainConfig,
    model_config_from_preset,
    schema,
)
from trainer.config.errors import quote
from trainer.config.estimate import held_out_tokens, max_train_tokens
from trainer.config.learning_groups import default_learning_rate

NOT_HYPERPARAMETERS = {"seed": "use the request's top-level `seed`"}


class HyperparameterError(ValueError):
    """An invalid request field: `param` names it (see the module docstring)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass
class Resolved:
    model_config: ModelConfig
    train_config: TrainConfig
    hyperparameters: dict[str, Any]  # what the job shows: OpenAI's three resolved + what was given


def _config_error(e: ConfigError) -> HyperparameterError:
    details = "; ".join(f"{name}: {msg}" for name, msg in e.problems)
    return HyperparameterError(f"Invalid hyperparameters: {details}", e.param)


def _unknown(name: str, accepted: list[str]) -> str:
    """An unknown name: the accepted one it is closest to, else them all."""
    close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
    if close:
        return (
            f"Unknown hyperparameter {quote(name)}: did you mean {close[0]}? "
            "(GET /v1/fine_tuning/hyperparameters lists them all)"
        )
    return f"Unknown hyperparameter {quote(name)}. Accepted: {', '.join(accepted)}"


def _check_names(
    raw: dict[str, Any], accepted: dict[str, schema.Hyperparameter], parent: dict[str, dict[str, Any]] | None
) -> None:
    """Unknown names, and, continuing a model (`parent`: its configs by section), an architecture or
    tokenizer field set to another value than the model's (the same value, as a script that started
    the model sends again, is accepted)."""
    for name, value in raw.items():
        if name in NOT_HYPERPARAMETERS:
            raise HyperparameterError(f"{name} is not a hyperparameter: {NOT_HYPERPARAMETERS[name]}", name)
        if name not in accepted:
            raise HyperparameterError(_unknown(name, list(accepted)), name)
        h = accepted[name]
        if parent is None or not h.from_source or value is None or (value == "auto" and h.accepts_auto):
            continue
        saved = parent[h.section].get(name)
        if _as_typed(value, h) != saved:
            raise HyperparameterError(
                f"hyperparameter {name} cannot be changed when continuing training from an existing model "
                f"(it has {name} {saved}, not {value}): the architecture and tokenizer come from that "
                "model. Leave it out, or start from a preset to change it.",
                name,
            )


def _model_config(over: dict[str, Any], preset: str | None, parent: dict[str, Any] | None) -> ModelConfig:
    if parent is not None:
        try:
            return ModelConfig.from_dict(parent)
        except ConfigError as e:  # a stored config we cannot read: not the user's fault
            raise HyperparameterError(f"the parent model's configuration is unreadable: {e}", "model") from e
    name = preset or DEFAULT_PRESET
    if name not in PRESETS:
        raise HyperparameterError(
            f"Unknown model {quote(name)}: use a preset ({', '.join(PRESETS)}) or the id of a model "
            "you trained",
            "model",
        )
    try:
        return model_config_from_preset(name, **over)
    except ConfigError as e:
        raise _config_error(e) from e


def _train_config(
    over: dict[str, Any], parent: dict[str, Any] | None, multiplier: float, seed: int
) -> TrainConfig:
    values = dict(over)
    for name in schema.TOKENIZER_FIELDS if parent else ():
        if name in parent:  # type: ignore[operator]
            values[name] = parent[name]  # type: ignore[index]
    base_lr = values.get("learning_rate", default_learning_rate(values.get("optimizer")))
    if isinstance(base_lr, int | float) and not isinstance(base_lr, bool):
        values["learning_rate"] = base_lr * multiplier
    values["seed"] = seed
    try:
        return TrainConfig(**values)
    except ConfigError as e:
        raise _config_error(e) from e


def resolve(
    raw: dict[str, Any] | None,
    *,
    preset: str | None = None,
    parent_model_config: dict[str, Any] | None = None,
    parent_train_config: dict[str, Any] | None = None,
    seed: int = 0,
) -> Resolved:
    """Validate `raw` for a new job from `preset`, or continuing a model whose configs are given.

    Raises HyperparameterError (message + param): unknown or forbidden names first, then every
    problem of the model config, then of the training config (all listed in the message)."""
    if raw is not None and not isinstance(raw, dict):
        raise HyperparameterError("hyperparameters must be a JSON object", "hyperparameters")
    accepted = {h.name: h for h in schema.job_hyperparameters()}
    raw = dict(raw or {})
    parent = None
    if parent_model_config is not None:
        parent = {"model": parent_model_config, "train": parent_train_config or {}}
    _check_names(raw, accepted, parent)
    # OpenAI's "auto" means the default; a null means the same for every field
    given = {k: v for k, v in raw.items() if v is not None and not (v == "auto" and accepted[k].accepts_auto)}
    try:
        multiplier = schema.check_value(
            accepted[schema.LEARNING_RATE_MULTIPLIER], given.pop(schema.LEARNING_RATE_MULTIPLIER, 1.0)
        )
    except ConfigError as e:
        raise _config_error(e) from e
    model_over = {k: v for k, v in given.items() if accepted[k].section == "model"}
    train_over = {k: v for k, v in given.items() if accepted[k].section == "train"}
    model_cfg = _model_config(model_over, preset, parent_model_config)
    train_cfg = _train_config(train_over, parent_train_config, multiplier, seed)
    if parent_model_config is None:
        # the model's vocabulary follows the tokenizer (the trainer sets it again from the real tokenizer)
        model_cfg.vocab_size = train_cfg.resolved_vocab_size

    shown: dict[str, Any] = {
        "n_epochs": train_cfg.n_epochs if "n_epochs" in given else "auto",
        "batch_size": train_cfg.batch_size,
        "learning_rate_multiplier": multiplier,
    }
    for name in raw:
        if name not in shown:
            shown[name] = _as_typed(raw[name], accepted[name])
    return Resolved(model_cfg, train_cfg, shown)


def _as_typed(value: Any, accepted: schema.Hyperparameter) -> Any:
    """A value as the job shows it: an integral float given for an integer (5.0) as the integer the
    config holds, else as given."""
    if accepted.kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


MIN_USEFUL_CTX = 16  # a shorter context is not worth suggesting: the data is what is too small


def _advice(tokens: int, *remedies: str) -> str:
    """The advice "Use A, B or C.": first a ctx that `tokens` allows, when that context is worth training."""
    options = ([f"ctx <= {tokens - 1}"] if tokens - 1 >= MIN_USEFUL_CTX else []) + list(remedies)
    return "Use " + (", ".join(options[:-1]) + " or " if len(options) > 1 else "") + options[-1] + "."


def check_context(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    training_tokens: int,
    has_validation_file: bool,
    validation_tokens: int | None = None,
) -> None:
    """HyperparameterError (param `ctx`) when the data cannot fill one window of ctx+1 tokens.

    As in trainer.data.prepare: with a validation file the whole training file trains; otherwise the
    last val_fraction of the tokens is held out for validation (trainer.config.estimate.held_out_tokens),
    and when that split is not empty and evaluation is on, it too needs one window. The token count is
    an upper bound (core.models.File.token_bound; exact for the byte tokenizer), so a rejected job could
    never have run."""
    need = model_cfg.ctx + 1
    train_tokens = max_train_tokens(train_cfg, training_tokens, has_validation_file)
    n_val = 0 if has_validation_file else held_out_tokens(training_tokens, train_cfg.val_fraction)
    if train_tokens < need:
        split = (
            ""
            if has_validation_file
            else f" after holding out val_fraction={train_cfg.val_fraction} for validation"
        )
        raise HyperparameterError(
            f"ctx={model_cfg.ctx} is longer than the training data allows: the training file gives at most "
            f"{train_tokens} training tokens{split}, and one training window needs ctx+1 = {need} tokens. "
            + _advice(train_tokens, "more training data"),
            "ctx",
        )
    if train_cfg.eval_every != 0:  # auto (None) evaluates
        val_tokens = (validation_tokens or 0) if has_validation_file else n_val
        if 0 < val_tokens < need or (has_validation_file and val_tokens < need):
            where = (
                "the validation file"
                if has_validation_file
                else (f"the validation split (val_fraction={train_cfg.val_fraction} of the training file)")
            )
            raise HyperparameterError(
                f"ctx={model_cfg.ctx} is longer than {where} allows: it has at most {val_tokens} tokens and one "
                f"evaluation window needs ctx+1 = {need}. "
                + _advice(val_tokens, "more validation data", "eval_every=0 to skip evaluation"),
                "ctx",
            )
