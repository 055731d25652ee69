"""`OneAtATime`: work done on a background thread, one piece at a time, with what follows each
piece run back on the caller's thread.

Starting a piece first waits for the one before (so at most one is in flight and whatever memory
it holds is bounded). A piece's follow-up runs on the caller's thread at the next `poll()` or
`wait()`, so the code it calls never sees two threads; a piece that failed raises its error there.
The trainer writes checkpoints with it (trainer.run.checkpoint_writer) and the worker uploads them
(worker.checkpoint_uploads).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


class OneAtATime:
    def __init__(self, name: str, nice: int = 0) -> None:
        """`nice`: how much lower than the caller's the background thread's CPU priority is (Linux):
        on a machine whose cores all train, the training threads come first."""
        self.name, self.nice = name, nice
        self.busy_seconds = 0.0  # spent working on the background thread
        self.waited_seconds = 0.0  # the caller's thread spent waiting for a piece to finish
        self.follow_up_seconds = 0.0  # the caller's thread spent in follow-ups
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._after: list[Callable[[], None]] = []  # follow-ups of finished pieces, in order

    @property
    def idle(self) -> bool:
        return self._thread is None

    def start(self, work: Callable[[], None], after: Callable[[], None] | None = None) -> None:
        """Run `work` in the background (after waiting for the piece in flight); `after` runs on
        the caller's thread once it is done."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(work, after), name=self.name, daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], None], after: Callable[[], None] | None) -> None:
        _lower_priority(self.nice)
        start = time.perf_counter()
        try:
            work()
        except BaseException as error:  # raised on the caller's thread at its next poll/wait
            self._error = error
            return
        finally:
            self.busy_seconds += time.perf_counter() - start
        if after is not None:
            self._after.append(after)

    def poll(self) -> None:
        """When the piece in flight has finished: its follow-up (or its error), on this thread."""
        if self._thread is not None and not self._thread.is_alive():
            self.wait()

    def wait(self) -> None:
        """Until nothing is in flight; then the follow-ups of finished pieces, on this thread."""
        if self._thread is not None:
            start = time.perf_counter()
            self._thread.join()
            self._thread = None
            self.waited_seconds += time.perf_counter() - start
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        while self._after:
            start = time.perf_counter()
            try:
                self._after.pop(0)()
            finally:
                self.follow_up_seconds += time.perf_counter() - start

    def close(self) -> None:
        """When the caller is failing anyway: let the piece in flight finish, then drop its
        follow-ups and its error (the caller's own error is the one to report)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._error = None
        self._after.clear()


def _lower_priority(nice: int) -> None:
    """Lower this thread's scheduling priority by `nice` (Linux takes a thread id for it)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:  # not allowed here: the thread keeps its priority
        pass
