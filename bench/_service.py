"""Shared helpers for the service benchmarks: start a real `fromscratch serve` (embedded SQLite or
Postgres + Redis) on a free loopback port in a throwaway data dir, talk to it, and read a process's
peak RSS. Not a benchmark itself."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = REPO_ROOT / "tests" / "data" / "tiny_shakespeare_100k.txt"
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no data."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def print_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    table = [head, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        print(
            "  ".join(
                c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1).strip() if m else cpu
    return f"{cpu}, {os.cpu_count()} cores"


# ------------------------------------------------------------------------------ memory of a process
def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    m = re.search(rf"^{field_name}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) if m else 0


def reset_peak_rss(pid: int) -> int:
    """Reset the kernel's peak-RSS mark (VmHWM) of `pid` to its current RSS and return that (KiB)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    return rss_kib(pid)


# ------------------------------------------------------------------------------ Postgres database
@contextlib.contextmanager
def fresh_postgres_db() -> Iterator[str]:
    """A new, empty database on the benchmark Postgres server (dropped afterwards); yields its URL."""
    import sqlalchemy as sa

    name = f"fs_bench_{secrets.token_hex(4)}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = str(sa.engine.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False))
    try:
        yield url
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# ------------------------------------------------------------------------------ a running service
@dataclass
class Service:
    url: str
    api_key: str
    proc: subprocess.Popen[str]
    data_dir: Path
    env: dict[str, str]
    log_path: Path
    _client: httpx.Client | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        """The API process (`fromscratch serve` runs uvicorn in-process; the worker is a child)."""
        return self.proc.pid

    @property
    def database_url(self) -> str:
        return self.env.get("FROMSCRATCH_DATABASE_URL") or f"sqlite:///{self.data_dir / 'fromscratch.db'}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.url, headers=self.headers, timeout=120.0)
        return self._client

    def upload(self, path: Path, filename: str | None = None) -> str:
        with open(path, "rb") as fh:
            r = self.client.post(
                "/v1/files",
                data={"purpose": "fine-tune"},
                files={"file": (filename or path.name, fh, "text/plain")},
            )
        r.raise_for_status()
        return str(r.json()["id"])

    def create_job(self, file_id: str, model: str, hyperparameters: dict[str, Any], seed: int = 1337) -> str:
        r = self.client.post(
            "/v1/fine_tuning/jobs",
            json={"model": model, "training_file": file_id, "hyperparameters": hyperparameters, "seed": seed},
        )
        if r.is_error:  # the API's message names the reason (placement, a limit, a field)
            raise RuntimeError(f"creating the job: {r.status_code} {r.text}")
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/fine_tuning/jobs/{job_id}")
        r.raise_for_status()
        return dict(r.json())

    def wait_job(self, job_id: str, timeout: float = 600.0, poll: float = 0.2) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in ("succeeded", "failed", "cancelled"):
                if job["status"] != "succeeded":
                    raise RuntimeError(
                        f"job {job_id} ended {job['status']}: {job.get('error')}\n{self.log_tail()}"
                    )
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} still {job['status']} after {timeout:.0f}s\n{self.log_tail()}"
                )
            time.sleep(poll)

    def metrics(self, job_id: str) -> list[dict[str, Any]]:
        r = self.client.get(f"/v1/fine_tuning/jobs/{job_id}/metrics", params={"limit": 100_000})
        r.raise_for_status()
        return list(r.json()["data"])

    def log_tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""


def service_env(
    data_dir: Path,
    *,
    database_url: str | None = None,
    broker_url: str | None = None,
    blob_backend: str = "db",
    threads: int | None = None,
    **extra: str,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    env["FROMSCRATCH_DATA_DIR"] = str(data_dir)
    env["FROMSCRATCH_BLOB_BACKEND"] = blob_backend
    if database_url:
        env["FROMSCRATCH_DATABASE_URL"] = database_url
    if broker_url:
        env["FROMSCRATCH_BROKER_URL"] = broker_url
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    # the benchmarks drive one key as hard as they can: they measure the service, not its per-key
    # rate limit (still counted on every request, so its cost is in the figures)
    env["FROMSCRATCH_RATE_LIMIT"] = "1000000/second"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update({f"FROMSCRATCH_{k.upper()}": v for k, v in extra.items()})
    return env


@contextlib.contextmanager
def serve(
    *,
    database_url: str | None = None,
    broker_url: str | None = None,
    blob_backend: str = "db",
    worker: bool = True,
    threads: int | None = None,
    timeout: float = 90.0,
    **extra: str,
) -> Iterator[Service]:
    """`fromscratch serve` in a temp data dir on a free loopback port, until the block ends (SIGTERM,
    then SIGKILL). `extra` become FROMSCRATCH_* settings."""
    data_dir = Path(tempfile.mkdtemp(prefix="fs-bench-serve-"))
    port = free_port()
    env = service_env(
        data_dir,
        database_url=database_url,
        broker_url=broker_url,
        blob_backend=blob_backend,
        threads=threads,
        **extra,
    )
    log_path = data_dir / "serve.log"
    cmd = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--log-level", "warning"]
    if not worker:
        cmd.append("--no-worker")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
    )
    svc: Service | None = None
    try:
        deadline = time.monotonic() + timeout
        key = _read_key(proc, log, deadline, log_path)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, deadline, log_path)

        def drain() -> None:  # keep the stdout pipe from filling up
            assert proc.stdout is not None
            for rest in proc.stdout:
                log.write(rest)

        threading.Thread(target=drain, daemon=True).start()
        svc = Service(url, key, proc, data_dir, env, log_path)
        yield svc
    finally:
        if svc is not None and svc._client is not None:
            svc._client.close()
        _stop(proc)
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def _read_key(proc: subprocess.Popen[str], log: TextIO, deadline: float, log_path: Path) -> str:
    """The API key from `serve`'s banner (the indented fsk-... line), copying the banner to `log`."""
    key = None
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        if line.strip().startswith("fsk-"):
            key = line.strip()
        if "API key" in line and "existing keys" in line:
            break
        if key or time.monotonic() > deadline:
            break
    if key is None:
        raise RuntimeError(f"`fromscratch serve` printed no API key\n{log_path.read_text(errors='replace')}")
    return key


def _wait_ready(url: str, proc: subprocess.Popen[str], deadline: float, log_path: Path) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"`fromscratch serve` did not become ready\n{log_path.read_text(errors='replace')}"
            )
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the service's process group, SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """`values` set in this process's environment (so in the processes it starts), then restored."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
