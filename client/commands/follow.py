"""`fromscratch jobs follow` (and `jobs create --follow`): a live progress bar fed by the job's
event stream, falling back to polling when the stream drops, then a summary table."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from client.commands.output import format_duration, format_number, make_console, print_json
from client.commands.runner import EXIT_CANCELLED, EXIT_ERROR, EXIT_OK
from core.status import TERMINAL, JobStatus

if TYPE_CHECKING:
    from rich.table import Table

    from client.http import Client

# `jobs follow`'s exit code by the job's final status (any other: EXIT_ERROR)
EXIT_CODES = {JobStatus.SUCCEEDED: EXIT_OK, JobStatus.CANCELLED: EXIT_CANCELLED}


class _FollowState:
    """What `jobs follow` knows about the job, fed by stream events, polls and job reads."""

    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.status: str = job.get("status", "?")
        p = job.get("progress") or {}
        self.step: int = p.get("step") or 0
        self.total: int | None = p.get("total_steps")
        self.train_loss: float | None = p.get("train_loss")
        self.val_loss: float | None = p.get("val_loss")
        self.tokens_per_s: float | None = p.get("tokens_per_s")
        self.eta: float | None = p.get("eta_seconds")
        self.last_event_id: str | None = None
        self._rate_origin: tuple[float, int] | None = None  # (created_at, step) for a local ETA
        self.plain_stream = False  # the server refused a made-up Last-Event-ID: start from scratch

    def job_update(self, job: dict[str, Any]) -> None:
        """Merge a fresh read of the job; its progress counts only if it is not older than ours."""
        self.job = {**self.job, **job}
        self.status = job.get("status", self.status)
        p = job.get("progress") or {}
        if isinstance(p.get("step"), int) and p["step"] >= self.step:
            self.step = p["step"]
            for attr, key in (
                ("train_loss", "train_loss"),
                ("val_loss", "val_loss"),
                ("tokens_per_s", "tokens_per_s"),
            ):
                if p.get(key) is not None:
                    setattr(self, attr, p[key])
            self.eta = p.get("eta_seconds")
        if p.get("total_steps"):
            self.total = p["total_steps"]

    def metric(self, m: dict[str, Any]) -> None:
        """Apply one metrics point (from the stream or a /metrics poll) and update the ETA."""
        step = m.get("step")
        if not isinstance(step, int):
            return
        val = m.get("val_loss", m.get("valid_loss"))
        if val is not None:
            self.val_loss = val
        if step < self.step:
            return  # an older point (a catch-up poll overlapping the stream)
        self.step = step
        if m.get("train_loss") is not None:
            self.train_loss = m["train_loss"]
        if m.get("tokens_per_s") is not None:
            self.tokens_per_s = m["tokens_per_s"]
        # ETA from the steps' own timestamps (server time), so a burst of replayed points does not
        # look infinitely fast; the server's eta_seconds stands until a second of history exists.
        t = m.get("created_at")
        if not isinstance(t, int | float):
            return
        if self._rate_origin is None or step < self._rate_origin[1]:
            self._rate_origin = (t, step)
        else:
            t0, s0 = self._rate_origin
            if step > s0 and t - t0 >= 1.0 and self.total:
                self.eta = max(0.0, (self.total - step) * (t - t0) / (step - s0))

    def event(self, name: str, data: Any) -> None:
        """Apply one SSE event of the job stream: `metrics` (a point as in /metrics), `status`
        ({status, message, created_at, job}); `message` events (lifecycle notes) change nothing here."""
        if not isinstance(data, dict):
            return
        if name == "metrics":
            self.metric(data)
        elif name == "status":
            if isinstance(data.get("job"), dict):
                self.job_update(data["job"])
            elif isinstance(data.get("status"), str):
                self.status = data["status"]

    def resume_id(self) -> str | None:
        """Last-Event-ID for the next connection: the stream's ids are "<step>.<seq>"; start after
        the newest step known, whether the stream or a poll brought it."""
        m = re.fullmatch(r"(-?\d+)\.(\d+)", self.last_event_id or "")
        if m:
            return f"{max(int(m.group(1)), self.step)}.{m.group(2)}"
        if self.last_event_id:
            return self.last_event_id
        return f"{self.step}.0" if self.step > 0 and not self.plain_stream else None


class _Follower:
    """The loop of `jobs follow`: the event stream while it holds; when it drops, polls of
    /metrics and the job, with the stream tried again after a growing pause."""

    JOB_READ_SECONDS = 5.0  # how often the job itself is read while the stream flows

    def __init__(self, client: Client, job_id: str, state: _FollowState, refresh: Callable[[], None]):
        self.client, self.job_id, self.state, self.refresh = client, job_id, state, refresh
        self.stream_failures = 0
        self.next_stream_try = 0.0
        self.last_job_read = time.monotonic()

    def run(self, poll_seconds: float) -> None:
        while self.state.status not in TERMINAL:
            if time.monotonic() >= self.next_stream_try and self._stream_again_at_once():
                continue
            self._catch_up()
            if self.state.status not in TERMINAL:
                time.sleep(poll_seconds)
        self.state.job_update(self.client.get_job(self.job_id))
        self.refresh()

    def _stream_again_at_once(self) -> bool:
        """Follow the stream until it ends or drops. True when it should be opened again at once:
        the server refused a made-up Last-Event-ID, so the next try starts from the beginning."""
        from client.http import APIError

        try:
            self._follow_stream()
        except APIError as e:
            if e.status_code == 400 and e.param == "Last-Event-ID" and not self.state.plain_stream:
                self.state.last_event_id, self.state.plain_stream = None, True
                return True
            if e.status_code in (401, 403, 404):
                raise
            self.stream_failures += 1
            # back off the stream; poll in between
            self.next_stream_try = time.monotonic() + min(30.0, 2.0 * self.stream_failures)
        return False

    def _follow_stream(self) -> None:
        state = self.state
        for ev in self.client.stream(self.job_id, state.resume_id()):
            if ev.id:
                state.last_event_id = ev.id
            try:
                state.event(ev.event, ev.json())
            except ValueError:
                continue
            self.stream_failures = 0
            if state.status in TERMINAL:
                self.refresh()
                return
            if time.monotonic() - self.last_job_read >= self.JOB_READ_SECONDS:
                # the job itself now and then: total steps and the server's ETA
                state.job_update(self.client.get_job(self.job_id))
                self.last_job_read = time.monotonic()
            self.refresh()

    def _catch_up(self) -> None:
        """The stream ended or dropped: poll from the last step shown (fills any gap, and an
        evaluation can fill in its val_loss after the step was read) and re-read the job."""
        page = self.client.metrics(self.job_id, after_step=self.state.step - 1, limit=1000)
        for m in page.get("data", []):
            self.state.metric(m)
        self.state.job_update(self.client.get_job(self.job_id))
        self.refresh()


def follow_job(client: Client, job_id: str, json_summary: bool = False, poll_seconds: float = 2.0) -> int:
    """Show a live progress bar until the job is terminal: SSE first, polling /metrics when the
    stream drops (reconnecting with Last-Event-ID now and then). Returns the exit code."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    state = _FollowState(client.get_job(job_id))

    def describe() -> str:
        eta = format_duration(state.eta) if state.eta is not None else "-"
        tps = format_number(state.tokens_per_s, ",.0f")
        return (
            f"loss {format_number(state.train_loss)}  val {format_number(state.val_loss)}  "
            f"{tps} tok/s  ETA {eta}"
        )

    with Progress(
        TextColumn("[bold]{task.fields[status]:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=make_console(stderr=True),
        transient=False,
    ) as bar:
        task = bar.add_task(
            "train", total=state.total, completed=state.step, status=state.status, info=describe()
        )

        def refresh() -> None:
            bar.update(task, total=state.total, completed=state.step, status=state.status, info=describe())

        _Follower(client, job_id, state, refresh).run(poll_seconds)

    job = state.job
    if json_summary:
        print_json(job)
    else:
        make_console().print(_summary_table(job, state))
    return EXIT_CODES.get(job.get("status", ""), EXIT_ERROR)


def _summary_table(job: dict[str, Any], state: _FollowState) -> Table:
    """The table printed when the followed job has ended."""

    from rich.table import Table

    table = Table(title=f"job {job.get('id')}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    started, finished = job.get("created_at"), job.get("finished_at")
    rows = [
        ("status", job.get("status")),
        ("steps", f"{state.step}/{state.total}" if state.total else str(state.step)),
        ("final train loss", format_number(state.train_loss)),
        ("final val loss", format_number(state.val_loss)),
        (
            "trained tokens",
            f"{job['trained_tokens']:,}" if isinstance(job.get("trained_tokens"), int) else "-",
        ),
        ("model", job.get("fine_tuned_model") or "-"),
        (
            "wall time",
            format_duration(finished - started)
            if isinstance(finished, int | float) and isinstance(started, int | float)
            else "-",
        ),
    ]
    err = job.get("error") or {}
    if err.get("message"):
        rows.append(("error", f"{err['message']} [{err.get('code') or '-'}]"))
    for key, value in rows:
        table.add_row(key, str(value))
    return table
