"""The first job of a fresh `fromscratch serve` is queued (issue 25, finding 8): created the instant
`/healthz` answers, while both workers are still starting and opening the broker for the first
time. Before `serve` prepared the broker's tables and queues (core.broker.prepare_broker) this
answered `503 ... the broker is unreachable (AttributeError)` now and then; the race itself is
exercised 20 times in tests/core/test_embedded_broker.py. And `serve` answers once its training worker
has advertised its devices (issue 23: a job sent the moment a GPU box's serve answered went to the
cpu queue and was refused as too large for it)."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import httpx

from tests.fixtures.service import ServiceProcess, free_port, fromscratch_cmd
from tests.worker.test_serve import _clean_env


def test_a_job_created_the_instant_serve_is_healthy_is_queued(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = ServiceProcess(
        cmd=fromscratch_cmd("serve", "--data-dir", str(data_dir), "--port", str(port)),
        env=_clean_env(),
        log_path=tmp_path / "serve.log",
    ).start()
    try:
        deadline = time.monotonic() + 120
        while True:  # poll tightly: the job goes in the moment the API answers
            assert process.alive and time.monotonic() < deadline, process.output()
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.02)
        # the training worker advertised itself before the API answered, so a job without `device`
        # is placed by what it has (api/placement.py: on a GPU box, the gpu queue) from the first one
        with sqlite3.connect(data_dir / "fromscratch.db") as db:
            advertised = [json.loads(q) for (q,) in db.execute("SELECT queues FROM workers")]
        assert any("cpu" in queues for queues in advertised), process.output()
        [key] = re.findall(r"fsk-[A-Za-z0-9_\-]+", process.output())
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
            text = b"the quick brown fox jumps over the lazy dog.\n" * 2000
            r = client.post("/v1/files", files={"file": ("a.txt", text)}, data={"purpose": "fine-tune"})
            assert r.status_code == 200, r.text
            r = client.post(
                "/v1/fine_tuning/jobs",
                json={
                    "model": "llama-tiny",
                    "training_file": r.json()["id"],
                    "hyperparameters": {"max_steps": 1},
                },
            )
            assert r.status_code == 200, f"{r.text}\n{process.output()}"
            assert client.post(f"/v1/fine_tuning/jobs/{r.json()['id']}/cancel").status_code == 200
        # the broker's queues are there (serve makes them before it starts the API and the workers)
        with sqlite3.connect(data_dir / "broker.db") as db:
            queues = {name for (name,) in db.execute("SELECT name FROM kombu_queue")}
        assert {"cpu", "gpu", "inference"} <= queues
    finally:
        process.stop(timeout=90)
