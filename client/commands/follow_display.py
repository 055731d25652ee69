"""What `jobs follow` shows while it follows a job, on stderr: a live progress bar on a terminal
(`BarDisplay`); anywhere else (a pipe, a log file, CI) plain lines written and flushed as things
happen (`LineDisplay`): one per status change, and the step at most once a second (a reconnect's
replay of the history is not a flood). Then the summary (`summary_rows`) on stdout."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from client.commands.output import format_duration, format_number, make_console
from core.status import TERMINAL

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class Followed(Protocol):
    """What the display reads of the followed job (client.commands.follow._FollowState)."""

    status: str
    waiting_for: str | None
    step: int
    total: int | None
    train_loss: float | None
    val_loss: float | None
    val_step: int | None
    tokens_per_s: float | None

    @property
    def eta(self) -> float | None: ...


def describe(state: Followed) -> str:
    eta = format_duration(state.eta) if state.eta is not None else "-"
    # the last evaluation's loss: its step beside it until the step shown is the evaluated one
    at = f" @{state.val_step}" if state.val_step is not None and state.val_step != state.step else ""
    # a paused job ends only after a resume, a queued one may wait for a worker: say why
    waiting = f"  (waiting: {state.waiting_for})" if state.waiting_for else ""
    if state.status == "paused":
        waiting = "  (paused: following until it is resumed and ends; Ctrl-C stops)"
    return (
        f"loss {format_number(state.train_loss)}  val {format_number(state.val_loss)}{at}  "
        f"{format_number(state.tokens_per_s, ',.0f')} tok/s  ETA {eta}{waiting}"
    )


class _Display:
    def __enter__(self) -> _Display:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def refresh(self) -> None:
        raise NotImplementedError


class LineDisplay(_Display):
    STEP_SECONDS = 1.0

    def __init__(self, state: Followed, stream: TextIO, clock: Callable[[], float] = time.monotonic):
        self.state, self.stream, self.clock = state, stream, clock
        self.shown_status: str | None = None
        self.shown_waiting: str | None = None
        self.shown_step: int | None = None
        self.last_step_line = -float("inf")

    def __enter__(self) -> LineDisplay:
        self.refresh()  # the job as it is now, at once
        return self

    def refresh(self) -> None:
        s = self.state
        status_changed = s.status != self.shown_status or s.waiting_for != self.shown_waiting
        step_due = s.step != self.shown_step and (
            self.clock() - self.last_step_line >= self.STEP_SECONDS
            or s.step == s.total
            or s.status in TERMINAL
        )
        if not (status_changed or step_due):
            return
        if s.step != self.shown_step:
            self.last_step_line = self.clock()
        self.shown_status, self.shown_step, self.shown_waiting = s.status, s.step, s.waiting_for
        steps = f"{s.step}/{s.total}" if s.total else str(s.step)
        self.stream.write(f"{s.status:<16} step {steps}  {describe(s)}\n")
        self.stream.flush()


class BarDisplay(_Display):
    def __init__(self, state: Followed):
        self.state = state
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self) -> BarDisplay:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.bar = Progress(
            TextColumn("[bold]{task.fields[status]:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            console=make_console(stderr=True),
            transient=False,
        )
        self.bar.start()
        s = self.state
        self.task = self.bar.add_task(
            "train", total=s.total, completed=s.step, status=s.status, info=describe(s)
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            self.bar.stop()

    def refresh(self) -> None:
        if self.bar is not None and self.task is not None:
            s = self.state
            self.bar.update(self.task, total=s.total, completed=s.step, status=s.status, info=describe(s))


def _span(start: object, end: object) -> str:
    if isinstance(start, int | float) and isinstance(end, int | float):
        return format_duration(end - start)
    return "-"


def summary_rows(
    job: dict[str, Any], step: int, total: int | None, train_loss: float | None, val_loss: float | None
) -> list[tuple[str, object]]:
    """The summary printed when the followed job has ended."""
    created, started, finished = job.get("created_at"), job.get("started_at"), job.get("finished_at")
    rows: list[tuple[str, object]] = [
        ("job", job.get("id")),
        ("status", job.get("status")),
        ("steps", f"{step}/{total}" if total else str(step)),
        ("last train loss", format_number(train_loss)),  # the last step's: the model may be an earlier best
        ("last val loss", format_number(val_loss)),
        (
            "trained tokens",
            f"{job['trained_tokens']:,}" if isinstance(job.get("trained_tokens"), int) else "-",
        ),
        ("model", job.get("fine_tuned_model") or "-"),
        ("run time", _span(started, finished)),  # from a worker's start: the queue is the next row's
        ("waited in queue", _span(created, started)),
    ]
    err = job.get("error") or {}
    if err.get("message"):
        rows.append(("error", f"{err['message']} [{err.get('code') or '-'}]"))
    return rows
