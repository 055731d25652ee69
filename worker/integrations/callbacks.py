"""`TrackedCallbacks`: the service's trainer callbacks, also handing every batch of metric rows
they write to the job's trackers, at the metrics flush cadence (never per step, never waiting)."""

from __future__ import annotations

from typing import Any

from worker.callbacks import ServiceCallbacks
from worker.integrations.trackers import Trackers


class TrackedCallbacks(ServiceCallbacks):
    def __init__(self, *args: Any, trackers: Trackers, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.trackers = trackers

    def flush(self, wait: bool = False) -> None:
        rows = self.buffer
        super().flush(wait)
        # A flush that wrote its rows starts a new buffer; one that did not (the database is away,
        # nothing to write) keeps them for the next, and a lost lease empties them.
        if self.buffer is not rows and rows:
            self.trackers.log(rows)
