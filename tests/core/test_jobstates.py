import threading
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.job_leases import after_lost_attempt, claim_job, renew_lease, requeue_expired
from core.jobstates import (
    TERMINAL,
    TRANSITIONS,
    ConcurrentUpdate,
    IllegalTransition,
    request_cancel,
    request_pause,
    resume,
    transition,
)
from core.models import Blob, Event, File, Job, utcnow
from core.status import JobStatus


def make_job(session: Session, status: str = "validating_files", queue: str = "cpu") -> Job:
    blob = Blob(backend="db", complete=True, size=1, sha256="0" * 64)
    session.add(blob)
    session.flush()
    file = File(
        owner_id="owner-t",
        filename="a.txt",
        purpose="fine-tune",
        bytes=1,
        sha256="0" * 64,
        format="text",
        blob_id=blob.id,
    )
    session.add(file)
    session.flush()
    job = Job(
        owner_id="owner-t", model="llama-tiny", training_file=file.id, status=status, seed=1, queue=queue
    )
    session.add(job)
    session.commit()
    return job


def events(session: Session, job: Job) -> list[str]:
    return list(session.scalars(select(Event.message).where(Event.job_id == job.id).order_by(Event.seq)))


def fresh(factory: sessionmaker[Session], job_id: str) -> Job:
    with factory() as s:
        return s.get(Job, job_id)


def test_table_covers_every_status() -> None:
    assert set(TRANSITIONS) == set(tuple(JobStatus))
    assert all(TRANSITIONS[s] == frozenset() for s in TERMINAL)
    assert all(targets <= set(tuple(JobStatus)) for targets in TRANSITIONS.values())


def test_legal_path_stamps_times_and_writes_events(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        job = make_job(s)
        assert claim_job(s, job.id, "w1", 30) is not None
        job = s.get(Job, job.id)
        transition(s, job, "running", total_steps=50)
        s.commit()
        assert job.started_at is not None and job.total_steps == 50 and job.finished_at is None
        transition(s, job, "succeeded", fine_tuned_model="ft:llama-tiny:x")
        s.commit()
    done = fresh(any_factory, job.id)
    assert done.status == "succeeded" and done.fine_tuned_model == "ft:llama-tiny:x"
    assert done.finished_at is not None and done.finished_at >= done.started_at
    assert done.lease_owner is None and done.lease_expires_at is None  # the hold ends with the job
    with any_factory() as s:
        assert events(s, job) == ["Job status: running", "Job status: succeeded"]


def test_illegal_transitions_raise_and_change_nothing(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        job = make_job(s, status="succeeded")
        for target in ("running", "queued", "failed", "cancelled"):
            with pytest.raises(IllegalTransition, match="succeeded"):
                transition(s, job, target)
        with pytest.raises(IllegalTransition):
            transition(s, make_job(s, status="paused"), "running")
        with pytest.raises(IllegalTransition):
            transition(s, make_job(s, status="queued"), "bogus")
        with pytest.raises(TypeError):
            transition(s, make_job(s, status="queued"), "running", not_a_column=1)
        s.commit()
        assert fresh(any_factory, job.id).status == "succeeded" and events(s, job) == []


def test_stale_object_loses_to_a_concurrent_change(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as a:
        job_a = make_job(a, status="queued")
        with any_factory() as b:
            transition(b, b.get(Job, job_a.id), "cancelled")
            b.commit()
        with pytest.raises(ConcurrentUpdate):
            transition(a, job_a, "running")
        assert job_a.status == "cancelled"  # re-read so the caller can decide again


def test_claim_is_exclusive_and_replays_are_dropped(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        job = make_job(s)
    winners: list[str] = []
    barrier = threading.Barrier(4)

    def claim(worker: str) -> None:
        with any_factory() as s:
            barrier.wait()
            if claim_job(s, job.id, worker, 30) is not None:
                winners.append(worker)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    claimed = fresh(any_factory, job.id)
    assert claimed.lease_owner == winners[0] and claimed.attempts == 1

    with any_factory() as s:
        job = s.get(Job, job.id)
        transition(s, job, "running")
        s.commit()
        assert claim_job(s, job.id, "w9", 30) is None  # running: a replayed message is dropped
        transition(s, job, "succeeded")
        s.commit()
        assert claim_job(s, job.id, "w9", 30) is None  # finished
        assert claim_job(s, "ftjob-missing", "w9", 30) is None


def test_lease_renew_until_the_reaper_takes_it_back(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        job = make_job(s)
        claim_job(s, job.id, "w1", 30)
        assert renew_lease(s, job.id, "w1", 30)
        assert not renew_lease(s, job.id, "w2", 30)
    _expire(any_factory, job.id)
    with any_factory() as s:
        assert requeue_expired(s, max_attempts=3) == [(job.id, "cpu")]
        assert not renew_lease(s, job.id, "w1", 30)  # lost: the worker must stop
    assert fresh(any_factory, job.id).lease_owner is None
    with any_factory() as s:  # re-queued: claimable again
        assert claim_job(s, job.id, "w2", 30) is not None


def _expire(factory: sessionmaker[Session], job_id: str) -> None:
    with factory() as s:
        s.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)
        s.commit()


def test_expired_lease_requeues_then_fails_after_max_attempts(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        job = make_job(s, queue="gpu")
        live = make_job(s)
        claim_job(s, live.id, "healthy", 60)
    for attempt in (1, 2):
        with any_factory() as s:
            assert claim_job(s, job.id, f"w{attempt}", 30) is not None
            transition(s, s.get(Job, job.id), "running")
            s.commit()
        _expire(any_factory, job.id)
        with any_factory() as s:
            assert not renew_lease(s, job.id, "someone-else", 30)
            requeued = requeue_expired(s, max_attempts=3)
        assert requeued == [(job.id, "gpu")]  # the healthy job's lease is untouched
        back = fresh(any_factory, job.id)
        assert (back.status, back.lease_owner, back.attempts) == ("queued", None, attempt)
        with any_factory() as s:
            assert not renew_lease(s, job.id, f"w{attempt}", 30)  # the lost worker learns it
            assert events(s, job)[-1] == f"worker lost; re-queued (attempt {attempt + 1} of 3)"

    with any_factory() as s:
        claim_job(s, job.id, "w3", 30)
        transition(s, s.get(Job, job.id), "running")
        s.commit()
    _expire(any_factory, job.id)
    with any_factory() as s:
        assert requeue_expired(s, max_attempts=3) == []
    failed = fresh(any_factory, job.id)
    assert (failed.status, failed.error_code, failed.lease_owner) == ("failed", "worker_lost", None)
    assert "3 attempts" in failed.error_message and failed.finished_at is not None
    assert fresh(any_factory, live.id).lease_owner == "healthy"


@pytest.mark.parametrize(
    "status, cancel, pause, attempts, outcome",
    [
        ("running", False, False, 1, "queued"),
        ("running", False, False, 3, "failed"),  # attempts used up
        ("running", True, True, 3, "cancelled"),  # a stop asked for wins over a re-queue or failure
        ("running", False, True, 1, "paused"),
        ("running", False, True, 3, "paused"),
        ("cancelled", False, False, 1, "cancelled"),
    ],
)
def test_a_lost_attempt_honours_a_stop_then_requeues_then_fails(
    status: str, cancel: bool, pause: bool, attempts: int, outcome: str
) -> None:
    job = Job(status=status, cancel_requested=cancel, pause_requested=pause, attempts=attempts)
    assert after_lost_attempt(job, max_attempts=3) == outcome


def test_expired_lease_of_a_cancelled_job_is_released(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        job = make_job(s)
        claim_job(s, job.id, "w1", 30)
        job = s.get(Job, job.id)
        request_cancel(s, job)  # cancelled at once; the worker dies before it lets go
        s.commit()
    _expire(any_factory, job.id)
    with any_factory() as s:
        assert requeue_expired(s, max_attempts=3) == []
    row = fresh(any_factory, job.id)
    assert (row.status, row.lease_owner, row.lease_expires_at) == ("cancelled", None, None)


def test_cancel_is_final_at_once_held_or_not(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        waiting = make_job(s, status="queued")
        request_cancel(s, waiting)
        s.commit()
        assert waiting.status == "cancelled"
        request_cancel(s, waiting)  # idempotent
        with pytest.raises(IllegalTransition, match="succeeded"):
            request_cancel(s, make_job(s, status="succeeded"))

        held = make_job(s)
        claim_job(s, held.id, "w1", 30)
        held = s.get(Job, held.id)
        transition(s, held, "running")
        request_cancel(s, held)
        s.commit()
    row = fresh(any_factory, held.id)
    # cancelled for every reader, while its worker keeps the lease until it has stopped
    assert (row.status, row.cancel_requested, row.lease_owner) == ("cancelled", True, "w1")
    assert row.finished_at is not None
    with any_factory() as s:
        assert request_cancel(s, s.get(Job, held.id)).status == "cancelled"  # asking again: a no-op
        with pytest.raises(IllegalTransition, match="cancelled"):
            request_pause(s, s.get(Job, held.id))
        with pytest.raises(IllegalTransition, match="cancelled"):
            resume(s, s.get(Job, held.id))
        s.rollback()
        transition(s, s.get(Job, held.id), "running")  # the worker had not started yet: nothing changes
        s.commit()
    assert (fresh(any_factory, held.id).status, fresh(any_factory, held.id).lease_owner) == (
        "cancelled",
        "w1",
    )
    with any_factory() as s:  # the worker finishes what it was doing: it only lets go
        transition(s, s.get(Job, held.id), "succeeded", fine_tuned_model="ft:llama-tiny:x")
        s.commit()
        assert events(s, held)[-2:] == ["Job status: cancelled", "The worker stopped: the job was cancelled"]
    row = fresh(any_factory, held.id)
    assert (row.status, row.lease_owner, row.fine_tuned_model) == ("cancelled", None, None)


@pytest.mark.parametrize("target", ["cancelled", "failed", "paused", "queued"])
def test_a_cancelled_jobs_worker_lets_go_whatever_it_asks(
    any_factory: sessionmaker[Session], target: str
) -> None:
    with any_factory() as s:
        job = make_job(s)
        claim_job(s, job.id, "w1", 30)
        job = s.get(Job, job.id)
        transition(s, job, "running")
        request_cancel(s, job)
        s.commit()
        job = s.get(Job, job.id)
        fields = {"error_code": "internal_error"} if target == "failed" else {}
        transition(s, job, target, **fields)
        s.commit()
    row = fresh(any_factory, job.id)
    assert (row.status, row.lease_owner, row.error_code) == ("cancelled", None, None)


def test_pause_and_resume(any_factory: sessionmaker[Session]) -> None:
    with any_factory() as s:
        job = make_job(s, status="queued")
        request_pause(s, job)
        s.commit()
        assert job.status == "paused"
        with pytest.raises(IllegalTransition, match="not paused"):
            resume(s, make_job(s, status="queued"))
        job, needs_enqueue = resume(s, job)
        s.commit()
        assert (job.status, job.attempts, needs_enqueue) == ("queued", 0, True)

        claim_job(s, job.id, "w1", 30)
        job = s.get(Job, job.id)
        transition(s, job, "running")
        request_pause(s, job)
        s.commit()
        assert (job.status, job.pause_requested) == ("running", True)
        job, needs_enqueue = resume(s, job)  # changed their mind before the worker paused
        s.commit()
        assert (job.status, job.pause_requested, needs_enqueue) == ("running", False, False)

        request_pause(s, job)
        transition(s, job, "paused")  # the worker saved a checkpoint and stopped
        s.commit()
    paused = fresh(any_factory, job.id)
    assert (paused.status, paused.pause_requested, paused.lease_owner) == ("paused", False, None)
