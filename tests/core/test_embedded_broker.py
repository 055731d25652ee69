"""The embedded broker (kombu's `sqla+sqlite://`) takes the first jobs of a fresh install (issue 25,
finding 8). Left to themselves, the API and both workers create the broker's tables and queue rows
on first use, all at once: "table kombu_message already exists" in one, and kombu's retry after it
publishing on a closed channel, the API's `503 ... (AttributeError)`. `fromscratch serve` now runs
`prepare_broker` before it starts any of them.

Each of ROUNDS fresh brokers is prepared as serve prepares it, then used for the first time at the
same instant by three real processes: the training worker's and the inference worker's consumers
(declaring their queues, as a worker does when it starts) and the API's enqueue path from
SENDERS threads. Every send must succeed and every message be in the broker. (Without the
preparation 7 of 8 rounds failed.)"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from core.broker import prepare_broker
from core.settings import Settings
from tests.fixtures.service import REPO_ROOT

ROUNDS = 20
SENDERS = 4
STEP = 0.4  # seconds between two rounds' instants

# role ("api", or the queues a worker consumes), first instant, dirs: one line per round
CHILD = r"""
import socket, sys, threading, time
from kombu import Queue
from core.broker import enqueue_job, make_celery
from core.settings import Settings

role, start, step, senders, dirs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]


def first_use(app, i):
    if role == "api":
        errors = []

        def send():
            try:
                enqueue_job(app, f"ftjob-{i}", "cpu")
            except Exception as e:
                errors.append(f"{type(e).__name__}: {str(e)[:200]}")

        threads = [threading.Thread(target=send) for _ in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("; ".join(errors))
        return
    with app.connection_for_read() as conn:
        queues = [Queue(q, routing_key=q) for q in role.split(",")]
        with conn.Consumer(queues, accept=["json"], callbacks=[lambda body, message: message.ack()]):
            try:
                conn.drain_events(timeout=0.2)
            except socket.timeout:
                pass


for i, data_dir in enumerate(dirs):
    app = make_celery(Settings(data_dir=data_dir))
    time.sleep(max(0.0, start + i * step - time.time()))
    try:
        first_use(app, i)
        print(i, "ok", flush=True)
    except Exception as e:
        print(i, "FAIL", f"{type(e).__name__}: {str(e)[:300]}", flush=True)
    finally:
        app.close()
"""


def test_twenty_fresh_brokers_take_their_first_jobs(tmp_path: Path) -> None:
    dirs = [tmp_path / f"install-{i}" for i in range(ROUNDS)]
    for d in dirs:
        d.mkdir()
        prepare_broker(Settings(data_dir=d))  # what `fromscratch serve` does before starting anything
    start = time.time() + 4.0  # the children import Celery first
    roles = ["api", "cpu,gpu", "inference"]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, role, str(start), str(STEP), str(SENDERS), *map(str, dirs)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for role in roles
    ]
    outputs = {role: child.communicate(timeout=240)[0] for role, child in zip(roles, children, strict=True)}
    for role, output in outputs.items():
        lines = [line for line in output.splitlines() if line.split(" ", 1)[0].isdigit()]
        assert lines == [f"{i} ok" for i in range(ROUNDS)], f"{role}:\n{output[-3000:]}"
    for d in dirs:  # every job's message is in its broker (taken or waiting)
        with sqlite3.connect(d / "broker.db") as db:
            (sent,) = db.execute("SELECT count(*) FROM kombu_message").fetchone()
        assert sent == SENDERS, d


def test_prepare_creates_every_queue_the_install_routes_to(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, gpu_worker_devices=4)
    prepare_broker(settings)
    prepare_broker(settings)  # a second start finds them
    with sqlite3.connect(tmp_path / "broker.db") as db:
        names = sorted(name for (name,) in db.execute("SELECT name FROM kombu_queue"))
    assert names == ["cpu", "gpu", "gpu.2", "gpu.3", "gpu.4", "inference"]
