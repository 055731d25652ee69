"""`CheckpointWriter`: checkpoint folders written on a background thread while the model trains.

The training thread takes a snapshot (trainer.checkpoint_snapshot: host copies, milliseconds to a
fraction of a second) and hands it over; the background thread writes and fsyncs the folder. At
most one write is in flight (trainer.run.one_at_a_time): the next hand-over first waits for the
previous write, so memory stays at one snapshot, whose buffers are reused. What follows a write
(reporting the folder to the callbacks, which store it) runs back on the training thread at its
next `poll()` or `wait()`; a failed write raises there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.checkpoint_snapshot import CheckpointSnapshot, HostBuffers, write_snapshot
from trainer.run.one_at_a_time import OneAtATime

BACKGROUND_NICE = 10  # the writer's (and the worker's uploads') CPU priority below training's


@dataclass
class CheckpointTimes:
    """What a run's background checkpoints cost, in seconds. On the training thread: taking the
    snapshots, waiting for a write still in flight, and reporting finished ones to the callbacks
    (which hand them to the worker's uploads); `stall` is their sum. On the writer's thread: `write`.
    `count` holds every folder written; `weights_only` of them are best/'s snapshots (no optimizer
    state: the lowest validation loss so far, not a point to resume from). `at_end`: step
    checkpoints written on the training thread as the run ended (a stop's or a pause's, or the last
    step kept beside an earlier best model), not among `count`."""

    count: int = 0
    snapshot: float = 0.0
    waited: float = 0.0
    reported: float = 0.0
    write: float = 0.0
    bytes: int = 0
    weights_only: int = 0
    at_end: int = 0

    @property
    def resumable(self) -> int:
        """The step checkpoints among them (weights and optimizer state: a run resumes from these)."""
        return self.count - self.weights_only

    @property
    def stall(self) -> float:
        return self.snapshot + self.waited + self.reported

    def summary(self) -> str | None:
        """One line for the end of a run; None when no checkpoint was written in the background."""
        if not self.count:
            return None
        return (
            f"{self.count} checkpoints ({self.bytes / 1e6:,.0f} MB of tensors) written in the background "
            f"in {self.write:.2f} s; training waited {self.stall:.2f} s for them (snapshots "
            f"{self.snapshot:.2f} s, a write in flight {self.waited:.2f} s, reporting {self.reported:.2f} s); "
            f"{self.kinds()}{self.at_end_note()}"
        )

    def kinds(self) -> str:
        return f"{self.resumable} step checkpoints, {self.weights_only} best-model snapshots (best/)"

    def at_end_note(self) -> str:
        """The step checkpoint written as the run ended, when there was one (not in the background)."""
        return f", and {self.at_end} step checkpoint as training ended" if self.at_end else ""


class CheckpointWriter:
    def __init__(self) -> None:
        self.buffers = HostBuffers()
        self._background = OneAtATime("checkpoint-writer", nice=BACKGROUND_NICE)
        self._count, self._bytes, self._snapshot_seconds = 0, 0, 0.0
        self._weights_only = 0
        self.at_end = 0  # step checkpoints written on the training thread (CheckpointTimes.at_end)

    def wait(self) -> None:
        """Until no write is in flight, then the follow-ups of finished ones (their errors raise)."""
        self._background.wait()

    def poll(self) -> None:
        self._background.poll()

    def reserve(self, like: dict[str, tuple[torch.Tensor, torch.dtype]]) -> None:
        """Allocate the snapshot buffers (`HostBuffers.reserve`) on the writer's thread, so pinning
        gigabytes of host memory does not hold up a training step."""
        self._background.start(lambda: self.buffers.reserve(like))

    def save(
        self,
        take: Callable[[HostBuffers], CheckpointSnapshot | None],
        path: Path,
        after: Callable[[], None] | None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Wait for the write in flight, take a snapshot into the buffers it freed (`take`; None:
        nothing to write on this rank) and write it to `path` in the background, then run `then`
        there too (rotation); `after` runs on the training thread once all that is done."""
        self.wait()
        start = time.perf_counter()
        snapshot = take(self.buffers)
        self._snapshot_seconds += time.perf_counter() - start
        if snapshot is None:
            return
        self._count += 1
        self._weights_only += snapshot.optimizer is None
        self._bytes += snapshot.nbytes

        def write() -> None:
            write_snapshot(snapshot, path)
            if then is not None:
                then()

        self._background.start(write, after)

    @property
    def times(self) -> CheckpointTimes:
        bg = self._background
        return CheckpointTimes(
            self._count,
            self._snapshot_seconds,
            bg.waited_seconds,
            bg.follow_up_seconds,
            bg.busy_seconds,
            self._bytes,
            self._weights_only,
            self.at_end,
        )

    def close(self) -> None:
        """At the end of a run: the write in flight finishes (unreported when the run failed), the
        buffers are freed."""
        self._background.close()
        self.buffers.clear()
