"""The reaper's lost-message pass at unit level, on both brokers (a Redis server of the test's own,
kombu's SQL transport on SQLite), each with a database of its own: it re-sends only the messages
the broker really lost, once, to the head of the queue, oldest job first."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from core.blobstore import blobstore_from_settings
from core.broker import TRAIN_TASK, make_celery
from core.broker_queues import queued_job_ids
from core.db import make_engine, make_session_factory
from core.models import Job, utcnow
from core.settings import Settings
from tests.fixtures.service import make_job, send_job
from tests.fixtures.throwaway_redis import ThrowawayRedis
from worker.reaper import Reaper


@dataclass
class Setup:
    settings: Settings
    session_factory: sessionmaker[Session]
    celery: Celery

    def reaper(self) -> Reaper:
        store = blobstore_from_settings(self.settings, self.session_factory)
        return Reaper(self.celery, self.settings, self.session_factory, store, interval=0.01)

    def waiting_job(self, *, sent: bool, owner_id: str = "owner-reaper") -> str:
        """A queued job nobody holds, last changed a minute ago; its message sent or not."""
        job_id = make_job(
            self.settings, self.session_factory, owner_id=owner_id, status="queued", enqueue=False
        )
        with self.session_factory() as session:
            session.execute(
                update(Job).where(Job.id == job_id).values(updated_at=utcnow() - timedelta(minutes=1))
            )
            session.commit()
        if sent:
            send_job(self.settings, job_id)
        return job_id

    def queued(self) -> list[str]:
        return queued_job_ids(self.celery, TRAIN_TASK, ["cpu"])


@pytest.fixture(params=["redis", "sqla"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    if request.param == "redis":
        create_db: Callable[..., str] = request.getfixturevalue("pg_database_factory")
        redis_server: ThrowawayRedis = request.getfixturevalue("throwaway_redis")
        settings = Settings(
            database_url=create_db(), broker_url=redis_server.url, data_dir=tmp_path, blob_backend="db"
        )
        engine = make_engine(settings.database_url)
        session_factory = make_session_factory(engine)
    else:
        settings = request.getfixturevalue("sqlite_settings")
        session_factory = request.getfixturevalue("sqlite_session_factory")
        engine = None
    celery = make_celery(settings)
    yield Setup(settings, session_factory, celery)
    celery.close()
    if engine is not None:
        engine.dispose()


def test_a_message_still_in_the_broker_is_not_resent(setup: Setup) -> None:
    job_id = setup.waiting_job(sent=True)
    reaper = setup.reaper()
    for _ in range(3):
        assert reaper.run_once()["resent"] == []
    assert setup.queued() == [job_id]  # still exactly one message


def test_a_lost_message_is_resent_once(setup: Setup) -> None:
    job_id = setup.waiting_job(sent=False)
    reaper = setup.reaper()
    assert reaper.run_once()["resent"] == []  # missing once: a worker may be taking it right now
    assert reaper.run_once()["resent"] == [job_id]  # missing twice, unchanged: lost
    for _ in range(3):
        assert reaper.run_once()["resent"] == []
    assert setup.queued() == [job_id]


def test_only_one_of_several_reapers_resends(setup: Setup) -> None:
    job_id = setup.waiting_job(sent=False)
    first, second = setup.reaper(), setup.reaper()
    for reaper in (first, second):
        reaper.run_once()
    resent = first.run_once()["resent"] + second.run_once()["resent"]
    assert resent == [job_id]
    assert setup.queued() == [job_id]


def test_lost_messages_go_to_the_head_oldest_job_first(setup: Setup) -> None:
    older = setup.waiting_job(sent=False)
    old = setup.waiting_job(sent=False)
    waiting = setup.waiting_job(sent=True)
    reaper = setup.reaper()
    reaper.run_once()
    assert sorted(reaper.run_once()["resent"]) == sorted([older, old])
    assert setup.queued() == [older, old, waiting]


def test_a_job_whose_owner_has_no_free_running_slot_waits(setup: Setup) -> None:
    owner = "owner-busy"
    running = setup.waiting_job(sent=False, owner_id=owner)
    with setup.session_factory() as session:  # the owner's one running slot is taken
        session.execute(
            update(Job)
            .where(Job.id == running)
            .values(status="running", lease_owner="w-1", lease_expires_at=utcnow() + timedelta(hours=1))
        )
        session.commit()
    setup.settings.max_running_jobs_per_key = 1
    deferred = setup.waiting_job(sent=False, owner_id=owner)
    reaper = setup.reaper()
    for _ in range(3):
        assert reaper.run_once()["resent"] == []  # it would only be deferred again
    with setup.session_factory() as session:  # the slot frees (the worker died before re-sending)
        session.execute(update(Job).where(Job.id == running).values(status="succeeded", lease_owner=None))
        session.commit()
    assert reaper.run_once()["resent"] == [deferred]  # seen missing all along: sent at once
    assert setup.queued() == [deferred]
