"""Request bodies of the public API as typed models: types, bounds and patterns are declared here
once, FastAPI validates them and shows them in the OpenAPI document, and a value that does not fit
is a 400 naming the field in `error.param` (api/errors.py). What needs the database (does the file
exist and belong to the caller, is the model a preset or one of theirs) stays in the routes.

Job creation is strict (no coercion: `"7"` is not a seed, `true` is not an integer) and refuses
unknown fields, as OpenAI does.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)
from pydantic_core import PydanticCustomError

from api.integration_models import Integrations

# Integers the database and torch can hold: every integer a request carries is bounded to 64 bits
# at the schema, so a larger one is a 400 naming it rather than an OverflowError in a query.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
INT32_MAX = 2**31 - 1
MAX_SEED = INT32_MAX
MAX_PROMPT_CHARS = 200_000  # far past any model's context (the longest prompt is cut to its last ctx tokens)
MAX_PROMPT_TOKENS = 100_000  # a prompt given as token ids
SUFFIX_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
METADATA_RULE = "expected an object of at most 16 string keys (<= 64 chars) with string values (<= 512 chars)"

FileId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128),
    Field(description="the id of a file you uploaded (POST /v1/files)"),
]


def _metadata_as_a_whole(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """One error naming `metadata` itself rather than one per offending key (keys are the user's)."""
    try:
        return handler(value)
    except ValidationError as e:
        raise PydanticCustomError("metadata_invalid", METADATA_RULE) from e


Metadata = Annotated[
    dict[
        Annotated[str, StringConstraints(max_length=64)],
        Annotated[str, StringConstraints(max_length=512)],
    ],
    Field(max_length=16, description="your own labels: " + METADATA_RULE.removeprefix("expected ")),
    WrapValidator(_metadata_as_a_whole),
]

Hyperparameters = Annotated[
    dict[str, Any],
    Field(
        description="the trainer's options, overriding the preset's architecture; their JSON Schema is "
        "GET /v1/fine_tuning/hyperparameters"
    ),
]


class SupervisedMethod(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    hyperparameters: Hyperparameters | None = None


class JobMethod(BaseModel):
    """OpenAI's `method`: only supervised training (from the data) exists here."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["supervised"] = "supervised"
    supervised: SupervisedMethod | None = None

    @property
    def hyperparameters(self) -> dict[str, Any] | None:
        return self.supervised.hyperparameters if self.supervised is not None else None


class JobCreate(BaseModel):
    """POST /v1/fine_tuning/jobs."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "model": "llama-tiny",
                    "training_file": "file-abc123",
                    "hyperparameters": {"max_steps": 200, "n_embd": 64, "learning_rate": 0.001},
                }
            ]
        },
    )

    model: str = Field(
        min_length=1,
        max_length=256,
        description="a preset (llama-tiny, llama-15m, ...) or the id of a model you trained",
    )
    training_file: FileId
    validation_file: FileId | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="random when not given")
    suffix: str | None = Field(
        None, pattern=SUFFIX_PATTERN, description="added to the model's id: letters, digits, '_', '-', '.'"
    )
    metadata: Metadata | None = None
    integrations: Integrations | None = None
    method: JobMethod | None = None
    # Declared after `method` on purpose: a field validator sees only the fields declared before it.
    hyperparameters: Hyperparameters | None = None

    @field_validator("hyperparameters")
    @classmethod
    def _not_also_in_method(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        method = info.data.get("method")
        if value is not None and method is not None and method.hyperparameters is not None:
            raise PydanticCustomError(
                "hyperparameters_twice",
                "give hyperparameters either at the top level or in method.supervised, not both",
            )
        return value

    def fingerprint(self) -> str:
        """sha256 of the request as validated, in a canonical form (keys sorted, nulls dropped):
        two bodies that ask for the same job have the same fingerprint."""
        canonical = json.dumps(
            self.model_dump(mode="json", exclude_none=True), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def requested_hyperparameters(self) -> dict[str, Any] | None:
        """The hyperparameters the caller gave, wherever they gave them."""
        if self.method is not None and self.method.hyperparameters is not None:
            return self.method.hyperparameters
        return self.hyperparameters


class FileUploadFields(BaseModel):
    """The form fields of POST /v1/files besides its `file` part. Others are refused, as in the JSON
    bodies: OpenAI's `expires_after` would otherwise be taken and not honoured."""

    model_config = ConfigDict(extra="forbid")

    purpose: Literal["fine-tune"] = Field(description="what the file is for: fine-tune (training data)")


class GenerateRequest(BaseModel):
    """POST /v1/models/{id}/generate: the fields and bounds of /v1/completions' (unknown fields are
    refused; max_tokens is bounded by the setting max_completion_tokens)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str = Field("", max_length=MAX_PROMPT_CHARS)
    max_tokens: int = Field(100, ge=1, le=INT64_MAX)
    temperature: float = Field(0.8, ge=0.0, le=2.0, description="0 is greedy decoding")
    top_k: int | None = Field(None, ge=1, le=INT64_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # torch's generator takes any seed in [-2**63, 2**64)
    seed: int | None = Field(
        None, ge=INT64_MIN, le=2**64 - 1, description="the same seed gives the same text"
    )
