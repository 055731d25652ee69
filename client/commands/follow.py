"""`fromscratch jobs follow` (and `jobs create --follow`): the job's progress fed by its event
stream, falling back to polling when the stream drops, then a summary (the display:
client.commands.follow_display)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from client.commands.follow_display import BarDisplay, LineDisplay, summary_rows
from client.commands.output import print_details, print_json
from client.commands.runner import EXIT_CANCELLED, EXIT_ERROR, EXIT_OK
from core.status import TERMINAL, JobStatus

if TYPE_CHECKING:
    from client.http import Client

# `jobs follow`'s exit code by the job's final status (any other: EXIT_ERROR)
EXIT_CODES = {JobStatus.SUCCEEDED: EXIT_OK, JobStatus.CANCELLED: EXIT_CANCELLED}


class _FollowState:
    """What `jobs follow` knows about the job, fed by stream events, polls and job reads."""

    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.status: str = job.get("status", "?")
        self.waiting_for: str | None = job.get("waiting_for")  # why a queued job cannot start
        p = job.get("progress") or {}
        self.step: int = p.get("step") or 0
        self.total: int | None = p.get("total_steps")
        self.train_loss: float | None = p.get("train_loss")
        self.val_loss: float | None = p.get("val_loss")
        self.val_step: int | None = None  # the step val_loss was measured at, where a metric said
        self.tokens_per_s: float | None = p.get("tokens_per_s")
        # the server's smoothed rate (trainer.config.throughput) as of the last job read, so the ETA
        # counts down with the steps the stream brings in between
        self.seconds_per_step: float | None = None
        self._rate_from(p)
        self.last_event_id: str | None = None
        self.plain_stream = False  # the server refused a made-up Last-Event-ID: start from scratch

    @property
    def eta(self) -> float | None:
        if self.seconds_per_step is None or not self.total:
            return None
        return max(self.total - self.step, 0) * self.seconds_per_step

    def _rate_from(self, p: dict[str, Any]) -> None:
        eta, left = p.get("eta_seconds"), (self.total or 0) - self.step
        self.seconds_per_step = eta / left if isinstance(eta, int | float) and left > 0 else None

    def job_update(self, job: dict[str, Any]) -> None:
        """Merge a fresh read of the job; its progress counts only if it is not older than ours."""
        self.job = {**self.job, **job}
        self.status = job.get("status", self.status)
        if "waiting_for" in job:
            self.waiting_for = job["waiting_for"]
        p = job.get("progress") or {}
        if p.get("total_steps"):
            self.total = p["total_steps"]
        if isinstance(p.get("step"), int) and p["step"] >= self.step:
            self.step = p["step"]
            for attr, key in (
                ("train_loss", "train_loss"),
                ("val_loss", "val_loss"),
                ("tokens_per_s", "tokens_per_s"),
            ):
                if p.get(key) is not None:
                    if key == "val_loss" and p[key] != self.val_loss:
                        self.val_step = None  # the job's latest evaluation, at a step it does not say
                    setattr(self, attr, p[key])
            self._rate_from(p)

    def metric(self, m: dict[str, Any]) -> None:
        """Apply one metrics point (from the stream or a /metrics poll). Throughput and the ETA stay
        the server's smoothed ones: a single step's tokens/s swings too much to show."""
        step = m.get("step")
        if not isinstance(step, int):
            return
        val = m.get("val_loss", m.get("valid_loss"))
        if val is not None and step >= (self.val_step or 0):
            self.val_loss, self.val_step = val, step
        if step < self.step:
            return  # an older point (a catch-up poll overlapping the stream)
        self.step = step
        if m.get("train_loss") is not None:
            self.train_loss = m["train_loss"]

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


def follow_job(
    client: Client,
    job_id: str,
    json_summary: bool = False,
    poll_seconds: float = 2.0,
    progress_stream: TextIO | None = None,
) -> int:
    """Show the job's progress until it is terminal (on stderr: a live bar on a terminal, plain lines
    as they come otherwise): SSE first, polling /metrics when the stream drops (reconnecting with
    Last-Event-ID now and then); then a summary on stdout. Returns the exit code."""
    state = _FollowState(client.get_job(job_id))
    stream = progress_stream or sys.stderr
    with BarDisplay(state) if stream.isatty() else LineDisplay(state, stream) as display:
        _Follower(client, job_id, state, display.refresh).run(poll_seconds)
    job = state.job
    if json_summary:
        print_json(job)
    else:
        print_details(summary_rows(job, state.step, state.total, state.train_loss, state.val_loss))
    return EXIT_CODES.get(job.get("status", ""), EXIT_ERROR)
