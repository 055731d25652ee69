"""The one schema of hyperparameters: architecture (ModelConfig), training (TrainConfig), presets.

Every field is declared once, here, with its type, default, bounds, help text and form hints
(`param(...)`). Everything else is derived from these declarations at run time by trainer.config.schema:
the options of `fromscratch train` and `fromscratch jobs create`, the API's validation of a job's
`hyperparameters`, the JSON Schema served at GET /v1/fine_tuning/hyperparameters and the
dashboard's new-job form. Adding a hyperparameter is adding a field below (and using it).

Import-light on purpose (pydantic, no torch): the API and the HTTP client import it. Types are
strict (JSON `"5"` is not an integer, `true` is not a number) except that an integral float is an
integer. Invalid values raise ConfigError listing *every* problem, each naming its field, so a user
fixes a bad config in one round trip.
"""

from trainer.config.errors import ConfigError
from trainer.config.fields import INT64_MAX
from trainer.config.model import DEFAULT_PRESET, PRESETS, ModelConfig, model_config_from_preset
from trainer.config.train import MAX_STEPS, TrainConfig

__all__ = [
    "DEFAULT_PRESET",
    "INT64_MAX",
    "MAX_STEPS",
    "PRESETS",
    "ConfigError",
    "ModelConfig",
    "TrainConfig",
    "model_config_from_preset",
]
