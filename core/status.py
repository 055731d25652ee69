"""Job statuses: the one enum every part uses (api, worker, client, dashboard via the API).

Import-light on purpose (no SQLAlchemy): the HTTP client imports it too. The transitions between
these statuses live in core.jobstates.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """A job's lifecycle, in the order a successful job passes through it (OpenAI's names): queued
    while it waits for a worker, validating_files while that worker validates its files."""

    QUEUED = "queued"
    VALIDATING_FILES = "validating_files"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A job in one of these never changes again.
TERMINAL: frozenset[JobStatus] = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# A worker may claim a job in one of these (when no lease is held); validating_files: a row written
# before jobs were created queued.
CLAIMABLE: frozenset[JobStatus] = frozenset({JobStatus.QUEUED, JobStatus.VALIDATING_FILES})
# A job in one of these is being worked on: its worker holds a lease.
ACTIVE: frozenset[JobStatus] = frozenset({JobStatus.VALIDATING_FILES, JobStatus.RUNNING})


def status_sets() -> dict[str, list[str]]:
    """The statuses and their sets as JSON (served to the dashboard, so it keeps no copy)."""
    return {
        "statuses": [s.value for s in JobStatus],
        "terminal": [s.value for s in JobStatus if s in TERMINAL],
        "claimable": [s.value for s in JobStatus if s in CLAIMABLE],
        "active": [s.value for s in JobStatus if s in ACTIVE],
    }
