"""A job request's hyperparameters -> (ModelConfig, TrainConfig), validated by trainer.config itself,
so `fromscratch train` and `POST /v1/fine_tuning/jobs` accept and reject exactly the same values.

Accepted names
--------------
- OpenAI's `n_epochs`, `batch_size`, `learning_rate_multiplier`; each may be `"auto"`
  (n_epochs auto = train for `max_steps` (default 1000); batch_size auto = 16;
  learning_rate_multiplier auto = 1.0, which multiplies `learning_rate`).
- Every architecture field of `ModelConfig` (`n_layer`, `n_head`, `n_kv_head`, `n_embd`, `ctx`,
  `rope_dims`, `rope_theta`, `ffn_dim`, `multiple_of`, `norm_eps`, `tie_embeddings`), overriding the
  preset named by `model`.
- Every training field of `TrainConfig`, named as the trainer CLI's options with underscores
  (`max_steps`, `learning_rate`, `warmup_steps`, `schedule`, `eval_every`, `checkpoint_every`,
  `tokenizer`, `vocab_size`, `dtype`, `device`, ...), except `seed` (the request's top-level `seed`)
  and `extra`.

When continuing training from an earlier model (`model` = a model id), the architecture and the
tokenizer come from that model: architecture fields, `tokenizer` and `vocab_size` are rejected.

`error.param` choice
--------------------
An invalid hyperparameter is reported with `param` = the bare field name (`"n_embd"`, `"ctx"`,
`"learning_rate"`, or the unknown name itself), exactly `ConfigError.param` of trainer.config. This is
what OpenAI's API does for hyperparameters (e.g. `"param": "n_epochs"`), it is the same whether the
hyperparameters came top-level or under `method.supervised.hyperparameters`, and it is the name a
user types on the CLI (with dashes). Top-level request fields use their own names (`model`,
`training_file`, `seed`, ...).
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from trainer.config import (
    MODEL_FIELDS,
    PRESETS,
    TRAIN_FIELDS,
    ConfigError,
    ModelConfig,
    TrainConfig,
    model_config_from_preset,
)

OPENAI_FIELDS = ("n_epochs", "batch_size", "learning_rate_multiplier")
NOT_HYPERPARAMETERS = {"seed": "use the request's top-level `seed`", "extra": "reserved"}
TOKENIZER_FIELDS = ("tokenizer", "vocab_size")
TRAIN_HP_FIELDS = tuple(f for f in TRAIN_FIELDS if f not in NOT_HYPERPARAMETERS)
ALL_FIELDS = tuple(dict.fromkeys((*OPENAI_FIELDS, *MODEL_FIELDS, *TRAIN_HP_FIELDS)))
DEFAULT_BATCH_SIZE = TrainConfig.__dataclass_fields__["batch_size"].default
DEFAULT_LEARNING_RATE = TrainConfig.__dataclass_fields__["learning_rate"].default

_HINTS: dict[str, Any] = {**typing.get_type_hints(TrainConfig), **typing.get_type_hints(ModelConfig)}


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


def _type_ok(value: Any, hint: Any) -> tuple[bool, Any]:
    """Check a JSON value against a dataclass field type; returns (ok, coerced value)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return True, None
        for arg in args:
            if arg is type(None):
                continue
            ok, v = _type_ok(value, arg)
            if ok:
                return True, v
        return False, value
    if origin is Literal:
        return value in typing.get_args(hint), value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        if isinstance(value, bool):
            return False, value
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return False, value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, value
        if not math.isfinite(value):
            return False, value
        return True, float(value)
    if hint is str:
        return isinstance(value, str), value
    return True, value


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is not None:
        parts = [_describe(a) for a in typing.get_args(hint) if a is not type(None)]
        text = " or ".join(parts)
        return text + (" or null" if type(None) in typing.get_args(hint) else "")
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def _check_field(name: str, value: Any) -> Any:
    hint = _HINTS[name]
    ok, coerced = _type_ok(value, hint)
    if not ok:
        raise HyperparameterError(f"hyperparameter {name} must be {_describe(hint)}, got {value!r}", name)
    return coerced


def _auto_or(name: str, value: Any, kind: type) -> Any:
    """OpenAI's fields: "auto", or a positive number of `kind`."""
    if value is None or value == "auto":
        return "auto"
    if kind is int:
        ok = (
            isinstance(value, int)
            and not isinstance(value, bool)
            or isinstance(value, float)
            and value.is_integer()
        )
        value = int(value) if ok else value
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    if not ok:
        raise HyperparameterError(
            f'hyperparameter {name} must be "auto" or a {"positive integer" if kind is int else "positive number"}, got {value!r}',
            name,
        )
    if value <= 0:
        raise HyperparameterError(f"hyperparameter {name} must be positive, got {value}", name)
    return value


def _config_error(e: ConfigError, prefix: str = "") -> HyperparameterError:
    details = "; ".join(f"{name}: {msg}" for name, msg in e.problems)
    return HyperparameterError(f"Invalid hyperparameters: {prefix}{details}", e.param)


def resolve(
    raw: dict[str, Any] | None,
    *,
    preset: str | None = None,
    parent_model_config: dict[str, Any] | None = None,
    parent_train_config: dict[str, Any] | None = None,
    seed: int = 0,
) -> Resolved:
    """Validate `raw` for a new job from `preset`, or continuing a model whose configs are given.

    Raises HyperparameterError (message + param) for the first problem of the first kind found:
    unknown names, then types, then every ConfigError problem (all listed in the message)."""
    if raw is not None and not isinstance(raw, dict):
        raise HyperparameterError("hyperparameters must be a JSON object", "hyperparameters")
    raw = dict(raw or {})
    for name in raw:
        if name in NOT_HYPERPARAMETERS:
            raise HyperparameterError(f"{name} is not a hyperparameter: {NOT_HYPERPARAMETERS[name]}", name)
        if name not in ALL_FIELDS:
            raise HyperparameterError(
                f"Unknown hyperparameter {name!r}. Accepted: {', '.join(ALL_FIELDS)}", name
            )
    continuing = parent_model_config is not None
    if continuing:
        for name in raw:
            if name in MODEL_FIELDS or name in TOKENIZER_FIELDS:
                raise HyperparameterError(
                    f"hyperparameter {name} cannot be set when continuing training from an existing model: "
                    "the architecture and tokenizer come from that model. Start from a preset to change it.",
                    name,
                )

    n_epochs = _auto_or("n_epochs", raw.get("n_epochs"), int)
    batch_size = _auto_or("batch_size", raw.get("batch_size"), int)
    lr_mult = _auto_or("learning_rate_multiplier", raw.get("learning_rate_multiplier"), float)

    model_over: dict[str, Any] = {}
    train_over: dict[str, Any] = {}
    for name, value in raw.items():
        if name in OPENAI_FIELDS:
            continue
        coerced = _check_field(name, value)
        (model_over if name in MODEL_FIELDS else train_over)[name] = coerced

    # model
    if continuing:
        assert parent_model_config is not None
        try:
            model_cfg = ModelConfig.from_dict(parent_model_config)
        except (ConfigError, TypeError) as e:  # a stored config we cannot read: not the user's fault
            raise HyperparameterError(f"the parent model's configuration is unreadable: {e}", "model") from e
    else:
        name = preset or "llama-tiny"
        if name not in PRESETS:
            raise HyperparameterError(
                f"Unknown model {name!r}: use a preset ({', '.join(PRESETS)}) or the id of a model you trained",
                "model",
            )
        try:
            model_cfg = model_config_from_preset(name, **model_over)
        except ConfigError as e:
            raise _config_error(e) from e

    # training
    train_values: dict[str, Any] = dict(train_over)
    if continuing and parent_train_config:
        for name in TOKENIZER_FIELDS:
            if name in parent_train_config:
                train_values[name] = parent_train_config[name]
    if n_epochs != "auto":
        train_values["n_epochs"] = n_epochs
    if batch_size != "auto":
        train_values["batch_size"] = batch_size
    base_lr = train_values.get("learning_rate", DEFAULT_LEARNING_RATE)
    multiplier = 1.0 if lr_mult == "auto" else lr_mult
    if isinstance(base_lr, int | float):
        train_values["learning_rate"] = base_lr * multiplier
    train_values["seed"] = seed
    try:
        train_cfg = TrainConfig(**train_values)
    except ConfigError as e:
        raise _config_error(e) from e
    if not continuing:
        # the model's vocabulary follows the tokenizer (the trainer sets it again from the real tokenizer)
        model_cfg.vocab_size = train_cfg.resolved_vocab_size

    shown: dict[str, Any] = {
        "n_epochs": n_epochs,
        "batch_size": train_cfg.batch_size,
        "learning_rate_multiplier": multiplier,
    }
    for name in raw:
        if name not in OPENAI_FIELDS:
            shown[name] = model_over.get(name, train_over.get(name))
    return Resolved(model_cfg, train_cfg, shown)


def estimate_max_tokens(n_bytes: int) -> int:
    """An upper bound on the tokens a file of `n_bytes` gives: every token (byte or BPE) covers at
    least one byte of text, and a JSONL record's EOS is paid for by its JSON syntax (>= 12 bytes)."""
    return n_bytes


def check_context(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    training_bytes: int,
    has_validation_file: bool,
    validation_bytes: int | None = None,
) -> None:
    """HyperparameterError (param `ctx`) when the data cannot fill one window of ctx+1 tokens.

    As in trainer.data: with a validation file the whole training file trains; otherwise the last
    int(n * val_fraction) tokens are held out for validation, and when that split is not empty and
    evaluation is on, it too needs one window. The token count is an upper bound (exact for the byte
    tokenizer on text), so a rejected job could never have run."""
    need = model_cfg.ctx + 1
    total = estimate_max_tokens(training_bytes)
    n_val = 0 if has_validation_file else int(total * train_cfg.val_fraction)
    train_tokens = total - n_val
    if train_tokens < need:
        split = (
            ""
            if has_validation_file
            else f" after holding out val_fraction={train_cfg.val_fraction} for validation"
        )
        raise HyperparameterError(
            f"ctx={model_cfg.ctx} is longer than the training data allows: the training file gives at most "
            f"{train_tokens} training tokens{split}, and one training window needs ctx+1 = {need} tokens. "
            f"Use ctx <= {max(train_tokens - 1, 1)} or upload more data.",
            "ctx",
        )
    if train_cfg.eval_every > 0:
        val_tokens = estimate_max_tokens(validation_bytes or 0) if has_validation_file else n_val
        if 0 < val_tokens < need or (has_validation_file and val_tokens < need):
            where = (
                "the validation file"
                if has_validation_file
                else (f"the validation split (val_fraction={train_cfg.val_fraction} of the training file)")
            )
            raise HyperparameterError(
                f"ctx={model_cfg.ctx} is longer than {where} allows: it has at most {val_tokens} tokens and one "
                f"evaluation window needs ctx+1 = {need}. Use ctx <= {max(val_tokens - 1, 1)}, more validation "
                "data, or eval_every=0 to skip evaluation.",
                "ctx",
            )
