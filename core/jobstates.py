"""The job state machine: the one place job statuses change.

    queued ─▶ validating_files ─▶ running ─▶ succeeded | failed | cancelled
      ▲ │              │              │
      │ └─────────────▶├──▶ paused ◀──┤ (resume: paused ─▶ queued)
      └────────────────┴──────────────┘ (lease expired: re-queued, attempts < max_attempts)

A new job is `queued` (waiting for a worker, OpenAI's meaning); the worker that takes it moves it to
`validating_files` while it validates and tokenizes the files, then to `running`.
Who holds a job: a worker that claimed it (`lease_owner`, lease renewed by heartbeat). A held
job's status changes only through its worker, with one exception: cancel. A pause is recorded as
a flag (`pause_requested`) the worker obeys between steps (it saves a checkpoint first), so the
job reads `running` until it is `paused`. A cancel is final at once: the job becomes `cancelled`
(with `cancel_requested` set, which the worker reads between steps) while its worker still holds
the lease; that worker's own final transition, whatever it asks for (succeeded, failed, paused,
queued, cancelled), then only lets go of the lease and the job stays `cancelled` (`_let_go`). So a
cancel answers `cancelled` and every later read agrees, and the worker's cleanup is unchanged: it
stops, writes nothing more once it let go, and its running slot counts until then (the running
quota counts held jobs). The reaper releases the lease of a cancelled job whose worker died. A job
nobody holds (waiting in the queue, paused) changes state at once.

Concurrency: every status change is a compare-and-set UPDATE on (status, lease_owner), so the API,
the worker and the reaper can race without overwriting each other; the loser gets
`ConcurrentUpdate` (an `IllegalTransition`) and re-reads. `transition()` and the request
helpers leave the commit to the caller, who groups them with its own writes (e.g. the final
checkpoint row together with `succeeded`). The lease helpers (claim, renew, release, hand back,
requeue_expired, and `attempts`, which they count) are core/job_leases.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args

from sqlalchemy import ColumnElement, inspect, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from core.models import Event, Job, utcnow
from core.status import TERMINAL, JobStatus

TRANSITIONS: dict[str, frozenset[str]] = {
    # the worker that validated the files goes on to train
    JobStatus.VALIDATING_FILES: frozenset(
        {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    # the worker that takes a queued job validates its files first (cheap when cached)
    JobStatus.QUEUED: frozenset(
        {
            JobStatus.VALIDATING_FILES,
            JobStatus.RUNNING,
            JobStatus.PAUSED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
        }
    ),
    JobStatus.RUNNING: frozenset(
        {JobStatus.QUEUED, JobStatus.PAUSED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.PAUSED: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

# Leaving for one of these ends the worker's hold on the job.
_RELEASES_LEASE = TERMINAL | {JobStatus.QUEUED, JobStatus.PAUSED}

# The levels an Event may have (OpenAI's FineTuningJobEvent.level); add_event refuses any other.
EventLevel = Literal["info", "warn", "error"]
EVENT_LEVELS: frozenset[str] = frozenset(get_args(EventLevel))

Result = TypeVar("Result")


class IllegalTransition(Exception):
    """A status change the state machine does not allow (or a request that makes no sense in the
    job's current status). The message says what the job's status is."""

    def __init__(self, message: str, *, current: str | None = None, target: str | None = None) -> None:
        super().__init__(message)
        self.current = current
        self.target = target


class ConcurrentUpdate(IllegalTransition):
    """Someone else changed the job (status or lease) since it was read; re-read and decide again."""


def add_event(
    session: Session,
    job_id: str,
    message: str,
    level: EventLevel = "info",
    data: dict[str, Any] | None = None,
    type: str = "message",
) -> Event:
    if level not in EVENT_LEVELS:  # the API serves levels as OpenAI's SDK types them
        raise ValueError(f"event level {level!r} is not one of {sorted(EVENT_LEVELS)}")
    event = Event(job_id=job_id, message=message, level=level, data=data, type=type)
    session.add(event)
    return event


def compare_and_set(session: Session, job: Job, values: dict[str, Any], *extra: ColumnElement[bool]) -> bool:
    """UPDATE the job's row only if its status and lease owner are still what `job` says; on
    success mirror the values onto `job` (without marking it dirty)."""
    session.flush()  # pending changes to `job` go first, so they cannot overwrite ours later
    owner_cond = Job.lease_owner.is_(None) if job.lease_owner is None else Job.lease_owner == job.lease_owner
    values = {**values, "updated_at": values.get("updated_at", utcnow())}
    result = session.execute(
        update(Job).where(Job.id == job.id, Job.status == job.status, owner_cond, *extra).values(**values),
        execution_options={"synchronize_session": False},
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    for key, value in values.items():
        set_committed_value(job, key, value)
    return True


def _check(current: str, new_status: str) -> None:
    if new_status not in TRANSITIONS:
        raise IllegalTransition(f"unknown job status {new_status!r}", current=current, target=new_status)
    if new_status not in TRANSITIONS[current]:
        raise IllegalTransition(
            f"a job that is {current} cannot become {new_status}", current=current, target=new_status
        )


def _status_message(job: Job, new_status: str) -> tuple[str, EventLevel, dict[str, Any]]:
    data: dict[str, Any] = {"status": new_status}
    if new_status == JobStatus.FAILED:
        data["error"] = {"code": job.error_code, "message": job.error_message, "param": job.error_param}
        return f"Job status: failed: {job.error_message or job.error_code or 'unknown error'}", "error", data
    return f"Job status: {new_status}", "info", data


def transition(
    session: Session,
    job: Job,
    new_status: str,
    *,
    keep_lease: bool = False,
    guard: ColumnElement[bool] | None = None,
    **fields: Any,
) -> Job:
    """Move `job` to `new_status` (setting any other Job columns given in `fields`), stamp
    started_at/finished_at, release the lease when the worker's hold ends (unless `keep_lease`:
    a cancel of a held job), and write the lifecycle Event. Raises IllegalTransition, or
    ConcurrentUpdate when the row changed under us (or no longer matches `guard`, a condition on
    the row such as "the lease is still the expired one"). The caller commits.

    A job cancelled while a worker holds it is already final: its worker's transition only lets go
    of the lease when it ends the hold, and changes nothing when it does not (running: the worker
    stops at its next step, when it reads `cancel_requested`)."""
    if job.status == JobStatus.CANCELLED and job.lease_owner is not None and not keep_lease:
        return _let_go(session, job) if new_status in _RELEASES_LEASE else job
    old = job.status
    _check(old, new_status)
    unknown = set(fields) - set(inspect(Job).column_attrs.keys())
    if unknown:
        raise TypeError(f"not Job columns: {sorted(unknown)}")
    now = utcnow()
    values: dict[str, Any] = {**fields, "status": new_status, "updated_at": now}
    if new_status == JobStatus.RUNNING and job.started_at is None:
        values.setdefault("started_at", now)
    if new_status in TERMINAL:
        values.setdefault("finished_at", now)
    if new_status in _RELEASES_LEASE and not keep_lease:
        values.setdefault("lease_owner", None)
        values.setdefault("lease_expires_at", None)
    if new_status in TERMINAL or new_status == JobStatus.PAUSED:
        values.setdefault("pause_requested", False)
    if not compare_and_set(session, job, values, *(() if guard is None else (guard,))):
        session.refresh(job)
        raise ConcurrentUpdate(
            f"job {job.id} changed while moving {old} -> {new_status} (now {job.status})",
            current=job.status,
            target=new_status,
        )
    message, level, data = _status_message(job, new_status)
    add_event(session, job.id, message, level=level, data=data)
    return job


def _let_go(session: Session, job: Job) -> Job:
    """The worker of a job cancelled under it ends its hold: the lease is released, the job stays
    cancelled, and nothing the worker meant to record (a final model, an error) is written."""
    if not compare_and_set(
        session, job, {"lease_owner": None, "lease_expires_at": None, "pause_requested": False}
    ):
        session.refresh(job)
        raise ConcurrentUpdate(f"job {job.id} changed while its worker let go (now {job.status})")
    add_event(session, job.id, "The worker stopped: the job was cancelled", data={"step": job.step})
    return job


# ---- user requests (the caller commits) -----------------------------------------------------
def _retrying(session: Session, job: Job, attempt: Callable[[Job], Result]) -> Result:
    """Run `attempt(job)` again after a re-read when a worker/reaper changed the job under us."""
    for _ in range(5):
        try:
            return attempt(job)
        except ConcurrentUpdate:
            session.refresh(job)
    return attempt(job)


def _refuse_if_finished(job: Job, verb: str) -> None:
    if job.status in TERMINAL:
        raise IllegalTransition(f"job {job.id} already {job.status}; it cannot be {verb}", current=job.status)


def request_cancel(session: Session, job: Job) -> Job:
    """Cancel: the job is `cancelled` at once. A held one keeps its lease, with `cancel_requested`
    set: its worker stops at its next step, without a checkpoint, and lets go (see `transition`).
    Asking again is a no-op; other terminal jobs raise."""

    def attempt(job: Job) -> Job:
        if job.status == JobStatus.CANCELLED:
            return job
        _refuse_if_finished(job, "cancelled")
        held = job.lease_owner is not None
        return transition(session, job, JobStatus.CANCELLED, keep_lease=held, cancel_requested=held)

    return _retrying(session, job, attempt)


def request_pause(session: Session, job: Job) -> Job:
    """Pause: a job nobody holds is `paused` at once; a held one gets `pause_requested` and stays
    `running` until its worker has saved a checkpoint and stopped. Asking again is a no-op."""

    def attempt(job: Job) -> Job:
        if job.status == JobStatus.PAUSED:
            return job
        _refuse_if_finished(job, "paused")
        if job.lease_owner is None:
            return transition(session, job, JobStatus.PAUSED)
        if not job.pause_requested:
            if not compare_and_set(session, job, {"pause_requested": True}):
                raise ConcurrentUpdate("job changed", current=job.status)
            add_event(session, job.id, "Pause requested")
        return job

    return _retrying(session, job, attempt)


def resume(session: Session, job: Job) -> tuple[Job, bool]:
    """Resume: paused -> queued (attempts reset; the caller enqueues it after commit). A job whose
    pause was requested but not yet obeyed simply keeps running. Returns (job, needs_enqueue)."""

    def attempt(job: Job) -> tuple[Job, bool]:
        if job.status == JobStatus.PAUSED:
            return transition(session, job, JobStatus.QUEUED, attempts=0, cancel_requested=False), True
        if job.status in TERMINAL:
            raise IllegalTransition(
                f"job {job.id} is {job.status}; only a paused job can be resumed", current=job.status
            )
        if job.pause_requested:
            if not compare_and_set(session, job, {"pause_requested": False}):
                raise ConcurrentUpdate("job changed", current=job.status)
            add_event(session, job.id, "Pause request withdrawn")
            return job, False
        raise IllegalTransition(
            f"job {job.id} is {job.status}, not paused; nothing to resume", current=job.status
        )

    return _retrying(session, job, attempt)
