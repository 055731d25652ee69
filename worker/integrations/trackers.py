"""`Trackers`: a job's experiment trackers behind one background thread, so training never waits
for a tracking server.

The training thread only queues work: `start` (once), `log` (the metric rows each flush wrote to
the database, worker.integrations.callbacks) and `finish` (after the job's final transition).
The thread runs them in order, merging the logs that queued up meanwhile into one batch. A
tracker that raises is turned off for the rest of the job with exactly one `warn` event naming
it and the reason; the job itself never fails because of a tracker. `finish` waits for the
thread at most `tracker_finish_seconds`; a tracker still busy then is turned off the same way
(the thread goes on alone, as a daemon).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from worker.integrations.base import (
    RunEnd,
    RunInfo,
    TrackedStep,
    Tracker,
    TrackerError,
    summarize,
    tracked_steps,
)

log = logging.getLogger(__name__)
MAX_REASON_CHARS = 300

# warn(tracker, reason): records the one warn event of a tracker turned off
Warn = Callable[[Tracker, str], None]


def describe(exc: BaseException) -> str:
    """The reason an event gives: a TrackerError's own message, else the exception's type and text."""
    text = str(exc) if isinstance(exc, TrackerError) else f"{type(exc).__name__}: {exc}".rstrip(": ")
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


class Trackers:
    def __init__(self, trackers: list[Tracker], warn: Warn, finish_seconds: float = 300.0):
        self.trackers = list(trackers)
        self.warn = warn
        self.finish_seconds = finish_seconds
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._off: set[int] = set()  # id() of the trackers turned off
        self._lock = threading.Lock()
        self._summary: dict[str, float] = {}  # the run's summary (base.summarize)

    @classmethod
    def none(cls) -> Trackers:
        """No trackers: every call does nothing."""
        return cls([], lambda tracker, reason: None)

    # ------------------------------------------------------------------ the training thread
    def start(self, run: RunInfo) -> None:
        if not self.trackers or self._thread is not None:
            return
        self._queue.put(("start", run))
        self._thread = threading.Thread(target=self._work, name=f"trackers-{run.job_id}", daemon=True)
        self._thread.start()

    def log(self, rows: Mapping[int, Mapping[str, float | None]]) -> None:
        """Queue metric rows ({step: {column: value}}); returns at once."""
        if self._thread is None:
            return
        steps = tracked_steps(rows)
        if steps:
            summarize(self._summary, steps)
            self._queue.put(("log", steps))

    def finish(self, status: str | None, final_folder: Path | None) -> None:
        """End every tracker's run; waits up to `finish_seconds` (uploads included)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(("finish", RunEnd(status, final_folder, dict(self._summary))))
        thread.join(self.finish_seconds)
        if thread.is_alive():
            for tracker in self.trackers:
                self._turn_off(tracker, f"it did not finish within {self.finish_seconds:g} s")

    # ------------------------------------------------------------------ the trackers' thread
    def _work(self) -> None:
        pending: tuple[str, Any] | None = None
        while True:
            op, arg = pending or self._queue.get()
            pending = None
            if op == "log":
                batch: list[TrackedStep] = list(arg)
                while pending is None:  # every log waiting goes in this batch
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt[0] == "log":
                        batch.extend(nxt[1])
                    else:
                        pending = nxt
                arg = batch
            for tracker in self.trackers:
                if id(tracker) in self._off:
                    continue
                try:
                    getattr(tracker, op)(arg)
                except Exception as exc:  # any failure of a tracker turns it off, never the job
                    # the warning below says why; the traceback only where debugging asks for it
                    log.debug("tracker %s failed in %s", tracker.label, op, exc_info=True)
                    self._turn_off(tracker, describe(exc))
            if op == "finish":
                return

    def _turn_off(self, tracker: Tracker, reason: str) -> None:
        with self._lock:
            if id(tracker) in self._off:
                return
            self._off.add(id(tracker))
        log.warning("integration %s turned off: %s", tracker.label, reason)
        try:
            self.warn(tracker, reason)
        except Exception:  # the event is a courtesy; the job goes on
            log.warning("could not record that integration %s was turned off", tracker.label, exc_info=True)
