"""`fromscratch serve` as a user runs it: a subprocess on a fresh data dir (SQLite database, kombu's
sqla+sqlite broker, two supervised workers: training and inference), driven through its HTTP API."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.fixtures.service import (
    REPO_ROOT,
    SHAKESPEARE,
    ServiceProcess,
    _wait_http_ok,
    free_port,
    fromscratch_cmd,
    wait_until,
)

TERMINAL = ("succeeded", "failed", "cancelled")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(t) for t in text)
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def serve(tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """`fromscratch serve` on a fresh data dir; `@pytest.mark.serve_args(...)` adds options."""
    data_dir = tmp_path / "data"
    port = free_port()
    marker = request.node.get_closest_marker("serve_args")
    extra = [str(a) for a in marker.args] if marker else []
    process = ServiceProcess(
        cmd=fromscratch_cmd("serve", "--data-dir", str(data_dir), "--port", str(port), *extra),
        env=_clean_env(),
        log_path=tmp_path / "serve.log",
    ).start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http_ok(f"{url}/healthz", process, timeout=120)
        yield process, url, data_dir
    finally:
        process.stop(timeout=90)


def test_serve_embedded_end_to_end(serve) -> None:  # type: ignore[no-untyped-def]
    process, url, data_dir = serve
    output = process.output()
    keys = re.findall(r"fsk-[A-Za-z0-9_\-]+", output)
    assert len(keys) == 1, output
    key = keys[0]
    assert f"{url}/" in output  # the dashboard URL is printed with the key
    assert (data_dir / "fromscratch.db").exists()

    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as client:
        assert client.get("/healthz").status_code == 200
        with open(SHAKESPEARE, "rb") as fh:
            r = client.post(
                "/v1/files",
                files={"file": (SHAKESPEARE.name, fh, "text/plain")},
                data={"purpose": "fine-tune"},
            )
        assert r.status_code == 200, f"{r.text}\n{process.output()}"
        file_id = r.json()["id"]
        r = client.post(
            "/v1/fine_tuning/jobs",
            json={
                "model": "llama-tiny",
                "training_file": file_id,
                "hyperparameters": {
                    "max_steps": 30,
                    "batch_size": 4,
                    "checkpoint_every": 10,
                    "eval_every": 10,
                    "eval_batches": 2,
                },
            },
        )
        assert r.status_code == 200, f"{r.text}\n{process.output()}"
        job_id = r.json()["id"]

        def finished() -> dict | None:  # type: ignore[type-arg]
            job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
            return job if job["status"] in TERMINAL else None

        job = wait_until(
            finished, timeout=240, interval=0.5, message=lambda: f"the job to finish\n{process.output()}"
        )
        assert job["status"] == "succeeded", job
        assert job["fine_tuned_model"]
        assert job["trained_tokens"] == 30 * 4 * 128

        # the model answers through the inference worker `serve` started (embedded broker too)
        r = client.post(
            "/v1/completions",
            json={"model": job["fine_tuned_model"], "prompt": "ROMEO:", "max_tokens": 8, "seed": 1},
        )
        assert r.status_code == 200, f"{r.text}\n{process.output()}"
        assert r.json()["usage"]["completion_tokens"] > 0
        # the formats the job exported (default gguf, hf) are there at once
        r = client.get(f"/v1/models/{job['fine_tuned_model']}/content", params={"format": "gguf"})
        assert r.status_code == 200 and r.content[:4] == b"GGUF", r.text[:200]
        # upload, checkpoints and exports are files in the data dir: no model bytes in SQLite
        with sqlite3.connect(data_dir / "fromscratch.db") as db:
            backends = dict(db.execute("SELECT backend, count(*) FROM blobs GROUP BY backend").fetchall())
            assert db.execute("SELECT count(*) FROM blob_chunks").fetchone() == (0,)
        files = [p for p in (data_dir / "blobs").rglob("blob-*") if p.is_file()]
        assert set(backends) == {"fs"} and len(files) == backends["fs"] >= 4, (backends, files)

        # a second key made beside the running server, through the same settings
        made = subprocess.run(
            fromscratch_cmd("keys", "create", "--name", "x"),
            cwd=REPO_ROOT,
            timeout=120,
            env=_clean_env(FROMSCRATCH_DATA_DIR=str(data_dir)),
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stderr
        second = made.stdout.strip().splitlines()[-1]
        assert second.startswith("fsk-") and second != key
        r = client.get("/v1/fine_tuning/jobs", headers={"Authorization": f"Bearer {second}"})
        assert r.status_code == 200 and r.json()["data"] == []  # a new owner sees none of the first's jobs
        assert (
            client.get("/v1/fine_tuning/jobs", headers={"Authorization": "Bearer fsk-wrong"}).status_code
            == 401
        )


def test_serve_restarts_a_dead_worker_and_stops_cleanly(serve) -> None:  # type: ignore[no-untyped-def]
    process, url, _ = serve
    workers = wait_until(
        lambda: _children(process.pid) if len(_children(process.pid)) == 2 else None,
        timeout=60,
        message="the training and inference worker subprocesses",
    )
    killed = min(workers)
    os.kill(killed, signal.SIGKILL)
    replacement = wait_until(
        lambda: next((p for p in _children(process.pid) if p not in workers and _pid_alive(p)), None),
        timeout=60,
        message=lambda: f"a restarted worker\n{process.output()}",
    )
    assert "restarting it" in process.output()

    assert process.stop(timeout=90) == 0, process.output()
    assert not any(_pid_alive(p) for p in (workers - {killed}) | {replacement})
    assert "stopped" in process.output()


@pytest.mark.serve_args("--training-workers", 2)
def test_serve_runs_as_many_training_workers_as_asked(serve) -> None:  # type: ignore[no-untyped-def]
    """Two training workers (and the inference worker): two jobs can train at once."""
    process, url, _ = serve
    key = re.findall(r"fsk-[A-Za-z0-9_\-]+", process.output())[0]

    def training_workers() -> list[dict] | None:  # type: ignore[type-arg]
        rows = httpx.get(f"{url}/v1/workers", headers={"Authorization": f"Bearer {key}"}).json()["data"]
        training = [w for w in rows if "cpu" in w["queues"]]
        return training if len(training) == 2 else None

    both = wait_until(
        training_workers, timeout=90, message=lambda: f"two training workers\n{process.output()}"
    )
    assert len({w["id"] for w in both}) == 2 and len(_children(process.pid)) == 3
