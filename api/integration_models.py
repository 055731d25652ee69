"""A job's `integrations` (experiment trackers) as POST /v1/fine_tuning/jobs takes them.

OpenAI's W&B entry, `{"type": "wandb", "wandb": {"project", "name", "entity", "tags"}}`, and ours
for MLflow, `{"type": "mlflow", "mlflow": {"tracking_uri", "experiment", "run_name"}}`. Each entry
carries the settings object of its `type` and no other, so an error names the field as the caller
wrote it (`integrations.0.wandb.project`). Bounds keep the stored JSON small and within what the
trackers accept (W&B: 128-character names, 64-character tags). The job stores `stored()` of each
and answers them back in its `integrations` list; the workers' trackers (worker/integrations/)
read them from there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from core.tracking_uri import MAX_TRACKING_URI_CHARS, host_allowed, tracking_uri_problem

MAX_INTEGRATIONS = 4
MAX_TAGS = 32
Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class WandbSettings(BaseModel):
    """OpenAI's `wandb` object: the W&B project (and optionally entity, run name, tags)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    project: Name = Field(description="the W&B project the run is created in")
    name: Name | None = Field(None, description="the run's display name (default: the job id)")
    entity: Name | None = Field(None, description="the W&B team or user (default: the key's own)")
    tags: list[Tag] | None = Field(None, max_length=MAX_TAGS, description="added to the run's tags")


class MlflowSettings(BaseModel):
    """Ours: an MLflow tracking server the worker logs the run to over its REST API."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tracking_uri: str = Field(
        max_length=MAX_TRACKING_URI_CHARS,
        description="the tracking server's http(s) URL (no credentials: the worker has its own)",
    )
    experiment: Annotated[str, StringConstraints(min_length=1, max_length=256)] = Field(
        description="the experiment's name (created when it does not exist)"
    )
    run_name: Name | None = Field(None, description="the run's name (default: the job id)")

    @model_validator(mode="after")
    def _usable_uri(self) -> MlflowSettings:
        problem = tracking_uri_problem(self.tracking_uri)
        if problem is not None:
            raise _field_error(
                "tracking_uri", "tracking_uri_invalid", f"tracking_uri {problem}", self.tracking_uri
            )
        return self


class Integration(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["wandb", "mlflow"] = Field(
        description="which tracker; its settings go in the field so named"
    )
    wandb: WandbSettings | None = None
    mlflow: MlflowSettings | None = None

    @model_validator(mode="after")
    def _settings_of_its_type(self) -> Integration:
        if getattr(self, self.type) is None:
            raise ValidationError.from_exception_data(
                "Integration", [InitErrorDetails(type="missing", loc=(self.type,), input=None)]
            )
        other = "mlflow" if self.type == "wandb" else "wandb"
        if getattr(self, other) is not None:
            message = f"an integration of type {self.type!r} takes no {other!r}"
            raise _field_error(other, "integration_mismatch", message, getattr(self, other).model_dump())
        return self

    def stored(self) -> dict[str, Any]:
        """What the job keeps (and answers): `{"type": t, t: {...}}`."""
        settings = self.wandb if self.type == "wandb" else self.mlflow
        assert settings is not None
        return {"type": self.type, self.type: settings.model_dump(mode="json")}


def _field_error(field: str, kind: str, message: str, value: Any) -> ValidationError:
    """A validation error located at `field` of the model being validated (pydantic prefixes
    the model's own location), so the 400 names it."""
    return ValidationError.from_exception_data(
        "Integration",
        [InitErrorDetails(type=PydanticCustomError(kind, message), loc=(field,), input=value)],
    )


Integrations = Annotated[
    list[Integration],
    Field(
        max_length=MAX_INTEGRATIONS,
        description="experiment trackers the run is logged to: OpenAI's wandb, and mlflow (ours)",
    ),
]


def disallowed_tracker(integrations: list[Integration] | None, allowed: list[str]) -> str | None:
    """The `param` of the first tracking_uri whose host `allowed_tracker_hosts` does not list."""
    for i, integration in enumerate(integrations or []):
        mlflow = integration.mlflow
        if mlflow is not None and not host_allowed(mlflow.tracking_uri, allowed):
            return f"integrations.{i}.mlflow.tracking_uri"
    return None
