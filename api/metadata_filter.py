"""`GET /v1/fine_tuning/jobs?metadata[k]=v`: only jobs whose metadata holds every given pair.

The openai SDK's `jobs.list(metadata={"k": "v"})` sends exactly `metadata[k]=v` (its query string
nests a dict with brackets; a pair whose value is empty or None is left out, and so is
`metadata=None`), and OpenAI documents `metadata=null` for "jobs without metadata": both are
accepted. At most `MAX_FILTERS` pairs (a job has at most 16), keys and values as long as metadata's
own (64 / 512 characters); anything else named `metadata` is a 400 with `param` naming it.

In SQL on both databases, before pagination (so `has_more`/`after` page through the matches only):
PostgreSQL reads `metadata ->> key` (the key a bound parameter); SQLite looks the pair up in
`json_each(metadata)` (a JSON path would break on keys holding a quote).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, Text, cast, exists, func, or_, select

from api.errors import APIError, quote_input
from core.models import Job

MAX_FILTERS = 16
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 512
PREFIX, SUFFIX = "metadata[", "]"


@dataclass
class MetadataFilter:
    pairs: dict[str, str] = field(default_factory=dict)
    without_metadata: bool = False  # metadata=null

    @property
    def given(self) -> bool:
        return bool(self.pairs) or self.without_metadata


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_metadata_filter")


def parse_metadata_filter(items: list[tuple[str, str]]) -> MetadataFilter:
    """The filter in a query string's (name, value) items (other names are ignored)."""
    wanted = MetadataFilter()
    for name, value in items:
        if name == "metadata":
            if value != "null":
                raise _bad(
                    f"metadata={quote_input(value)}: filter with metadata[key]=value (one per pair), "
                    "or metadata=null for jobs without metadata",
                    "metadata",
                )
            wanted.without_metadata = True
            continue
        if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
            continue
        key = name[len(PREFIX) : -len(SUFFIX)]
        if "][" in key:  # metadata[a][b]=v: a nested object, where metadata values are strings
            raise _bad(f"{name}: metadata values are strings; filter with metadata[key]=value", name)
        if not key or len(key) > MAX_KEY_CHARS:
            raise _bad(f"metadata keys are 1 to {MAX_KEY_CHARS} characters (got {quote_input(key)})", name)
        if len(value) > MAX_VALUE_CHARS:
            raise _bad(f"{name}: metadata values are at most {MAX_VALUE_CHARS} characters", name)
        if wanted.pairs.get(key, value) != value:
            raise _bad(f"{name} is given twice with different values", name)
        wanted.pairs[key] = value
        if len(wanted.pairs) > MAX_FILTERS:
            raise _bad(f"at most {MAX_FILTERS} metadata[key]=value filters", name)
    if wanted.without_metadata and wanted.pairs:
        raise _bad(
            "metadata=null (jobs without metadata) cannot be combined with metadata[key]=value", "metadata"
        )
    return wanted


def metadata_conditions(wanted: MetadataFilter, dialect: str) -> list[ColumnElement[bool]]:
    """WHERE conditions on `jobs` for the filter (none when it is empty)."""
    if wanted.without_metadata:
        return [or_(Job.user_metadata.is_(None), cast(Job.user_metadata, Text).in_(("null", "{}")))]
    return [_has_pair(key, value, dialect) for key, value in wanted.pairs.items()]


def _has_pair(key: str, value: str, dialect: str) -> ColumnElement[bool]:
    if dialect == "sqlite":
        each = func.json_each(Job.user_metadata).table_valued("key", "value").alias("meta")
        return exists(select(1).select_from(each).where(each.c.key == key, each.c.value == value))
    return Job.user_metadata[key].as_string() == value
