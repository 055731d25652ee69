"""Memory of a big training file (issue 22, item 6): the API process while a file of `--size` bytes
is uploaded through POST /v1/files, and the training worker while it prepares a job on that file
(downloads the blob, validates and hashes it, trains the tokenizer, tokenizes it into the token cache).
Goals: API RSS growth <= 64 MB, worker RSS <= 512 MB, for a 1 GiB file.

A real `fromscratch serve` (API + its training worker; embedded SQLite unless `--postgres`) with the
blob store on `--backend` (s3: a throwaway SeaweedFS from tests/fixtures/seaweedfs.py). The file is
text (Shakespeare repeated; `--text words`: random words, 2 million distinct), written to a temp dir
in pieces and streamed from disk by httpx (and deleted once uploaded). RSS of
the API process and of the worker process is sampled every 50 ms (psutil when installed, else
/proc/PID/status), and the peak also taken from the kernel's VmHWM (reset before each phase). The
worker's figure covers the job from its creation until it turns `running` (then it is cancelled):
that is its download, validation, hashing and tokenization ("tokenize s"), with torch loaded.

    .venv/bin/python bench/upload_rss.py --backend fs             # 1 GiB
    .venv/bin/python bench/upload_rss.py --backend s3
    .venv/bin/python bench/upload_rss.py --backend db --size 268435456
    .venv/bin/python bench/upload_rss.py --tokenizer bpe          # a BPE trained on (a sample of) it
    .venv/bin/python bench/upload_rss.py --tokenizer bpe --text words   # 2M distinct words: BPE's worst
    .venv/bin/python bench/upload_rss.py --smoke                  # 20 MB
`--check` exits 1 when a goal is missed. Needs about 4x the size free in $TMPDIR (during the upload
the file, the API's temp copy and the blob; then the blob, the worker's copy and its uint16 tokens).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._service import (
    Service,
    environ,
    fresh_postgres_db,
    machine,
    print_table,
    reset_peak_rss,
    rss_kib,
    serve,
)
from bench.transfer import make_file

MB = 1_000_000
API_GOAL_MB = 64.0
WORKER_GOAL_MB = 512.0
SAMPLE_SECONDS = 0.05
PREPARING = ("validating_files", "queued")
WORDS = 2_000_000  # distinct words of --text words
BLOCK = 64 * MB  # --text words repeats a block of this size


def write_words(path: Path, size: int, seed: int = 0) -> None:
    """`size` bytes of random lowercase words, Zipf-distributed over WORDS distinct ones, 100 to a
    line: the worst case for BPE training's memory (its word table). A block of about BLOCK bytes
    (or `size`) is made, then written over and over."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 12, size=WORDS)
    letters = rng.integers(ord("a"), ord("z") + 1, size=int(lengths.sum()), dtype=np.uint8).tobytes()
    ends = np.cumsum(lengths).tolist()
    words = [letters[end - n : end] for end, n in zip(ends, lengths.tolist(), strict=True)]
    ids = (np.minimum(rng.zipf(1.1, size=min(size, BLOCK) // 6), WORDS) - 1).tolist()
    block = b"".join(b" ".join(words[i] for i in ids[k : k + 100]) + b"\n" for k in range(0, len(ids), 100))
    with open(path, "wb") as f:
        left = size
        while left:
            f.write(block[:left])
            left -= min(left, len(block))


def rss_bytes(pid: int) -> int:
    """The process's resident set now (psutil when installed, else /proc/PID/status VmRSS)."""
    try:
        import psutil
    except ImportError:
        return rss_kib(pid) * 1024
    return int(psutil.Process(pid).memory_info().rss)


@dataclass
class Sampler:
    """A thread sampling a process's RSS every SAMPLE_SECONDS, as (monotonic time, bytes)."""

    pid: int
    samples: list[tuple[float, int]] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop_event.is_set():
            with contextlib.suppress(OSError, ValueError):
                self.samples.append((time.monotonic(), rss_bytes(self.pid)))
            self.stop_event.wait(SAMPLE_SECONDS)

    def peak(self, until: float = float("inf")) -> int:
        return max((rss for t, rss in self.samples if t <= until), default=0)


@contextlib.contextmanager
def sampling(pid: int) -> Iterator[Sampler]:
    sampler = Sampler(pid)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        sampler.stop_event.set()
        thread.join()


def worker_pid(svc: Service, timeout: float = 120.0) -> int:
    """The training worker (`fromscratch worker --queues cpu,gpu`, a child of `serve`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if ppid == svc.pid and b"worker" in argv and b"cpu,gpu" in argv:
                    return int(proc.name)
        time.sleep(0.2)
    raise RuntimeError(f"no training worker under `fromscratch serve` (pid {svc.pid})\n{svc.log_tail()}")


@dataclass
class Upload:
    file_id: str
    seconds: float
    before: int  # API RSS, bytes
    peak: int


def upload(svc: Service, path: Path) -> Upload:
    """POST /v1/files, the file streamed from disk; the API's RSS sampled meanwhile."""
    before = reset_peak_rss(svc.pid) * 1024
    with sampling(svc.pid) as sampler:
        t0 = time.perf_counter()
        with open(path, "rb") as fh, httpx.Client(base_url=svc.url, headers=svc.headers, timeout=3600) as c:
            r = c.post(
                "/v1/files", data={"purpose": "fine-tune"}, files={"file": (path.name, fh, "text/plain")}
            )
        seconds = time.perf_counter() - t0
    r.raise_for_status()
    peak = max(sampler.peak(), rss_kib(svc.pid, "VmHWM") * 1024)
    return Upload(str(r.json()["id"]), seconds, before, peak)


@dataclass
class Prepare:
    seconds: float  # job created -> running
    before: int  # worker RSS, bytes
    peak: int


def prepare(svc: Service, file_id: str, tokenizer: str, timeout: float) -> Prepare:
    """A job on the file; the worker's RSS sampled until the job turns `running`, then it is
    cancelled (its training is not what is measured)."""
    pid = worker_pid(svc)
    time.sleep(1.0)  # let the worker finish starting (imports) before its baseline
    before = reset_peak_rss(pid) * 1024
    hyper: dict[str, Any] = {"max_steps": 2, "tokenizer": tokenizer}
    with sampling(pid) as sampler:
        t0 = time.monotonic()
        job_id = svc.create_job(file_id, "llama-tiny", hyper)
        status = _wait_while_preparing(svc, job_id, t0 + timeout)
        t_running = time.monotonic()
        hwm = rss_kib(pid, "VmHWM") * 1024  # read at once: training has barely begun
    if status != "running":
        raise RuntimeError(f"job {job_id} ended {status}: {svc.job(job_id).get('error')}\n{svc.log_tail()}")
    svc.client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel").raise_for_status()
    peak = max(sampler.peak(until=t_running), hwm)
    return Prepare(t_running - t0, before, peak)


def _wait_while_preparing(svc: Service, job_id: str, deadline: float) -> str:
    while (status := str(svc.job(job_id)["status"])) in PREPARING:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {status}\n{svc.log_tail()}")
        time.sleep(0.1)
    return status


@contextlib.contextmanager
def backend_settings(backend: str) -> Iterator[dict[str, str]]:
    """The FROMSCRATCH_* settings of the blob backend (s3: a throwaway SeaweedFS, its credentials in
    this process's AWS_* variables, which the service inherits)."""
    if backend != "s3":
        yield {}
        return
    from tests.fixtures.seaweedfs import start_seaweedfs

    # a short path: its unix sockets live in it (108 bytes at most); weed logs to $TMPDIR
    root = Path(tempfile.mkdtemp(prefix="fs-bench-weed-", dir="/tmp"))
    try:
        with environ({"TMPDIR": str(root)}):
            server = start_seaweedfs(root)
    except BaseException:  # (a failed start raises pytest's Failed, a BaseException)
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        with environ(server.env()):
            yield {"s3_bucket": server.bucket, "s3_endpoint_url": server.endpoint_url}
    finally:
        server.destroy()


def measure(args: argparse.Namespace, size: int, root: Path) -> tuple[Upload, Prepare]:
    src = root / "upload.txt"
    if args.text == "words":
        write_words(src, size)
    else:
        make_file(src, size)
    with contextlib.ExitStack() as stack:
        extra = stack.enter_context(backend_settings(args.backend))
        url = stack.enter_context(fresh_postgres_db()) if args.postgres else None
        svc = stack.enter_context(
            serve(database_url=url, blob_backend=args.backend, max_upload_bytes=str(size + MB), **extra)
        )
        up = upload(svc, src)
        src.unlink()  # the disk it took is the worker's now
        print(f"  uploaded {size / MB:,.0f} MB in {up.seconds:.1f} s", flush=True)
        prep = prepare(svc, up.file_id, args.tokenizer, timeout=args.timeout)
        print(f"  the worker prepared it in {prep.seconds:.1f} s", flush=True)
    return up, prep


def goal(value_mb: float, limit_mb: float) -> str:
    return f"{'✓' if value_mb <= limit_mb else '✗'} ≤ {limit_mb:.0f}"


def report(args: argparse.Namespace, size: int, up: Upload, prep: Prepare) -> bool:
    """Print the table; True when both goals are met."""
    growth = (up.peak - up.before) / MB
    worker_peak = prep.peak / MB
    db = "Postgres" if args.postgres else "SQLite"
    row = (
        f"{args.backend} ({db})",
        f"{args.tokenizer}, {args.text}",
        f"{size / MB:,.0f}",
        f"{up.before / MB:.1f}",
        f"{up.peak / MB:.1f}",
        f"{growth:.1f}",
        f"{size / MB / up.seconds:,.1f}",
        f"{prep.before / MB:.1f}",
        f"{worker_peak:.1f}",
        f"{prep.seconds:.1f}",
        goal(growth, API_GOAL_MB),
        goal(worker_peak, WORKER_GOAL_MB),
    )
    print()
    print(f"# upload_rss  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine()}")
    print_table(
        (
            "backend",
            "tokenizer, text",
            "file MB",
            "API before MB",
            "API peak MB",
            "API growth MB",
            "upload MB/s",
            "worker before MB",
            "worker peak MB",
            "tokenize s",
            "API growth",
            "worker peak",
        ),
        [row],
    )
    return growth <= API_GOAL_MB and worker_peak <= WORKER_GOAL_MB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("fs", "db", "s3"), default="fs")
    ap.add_argument("--size", type=int, default=None, help="bytes (default 1 GiB)")
    ap.add_argument("--smoke", action="store_true", help="20 MB instead of 1 GiB")
    ap.add_argument("--postgres", action="store_true", help="Postgres instead of embedded SQLite")
    ap.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte")
    ap.add_argument(
        "--text", choices=("shakespeare", "words"), default="shakespeare", help="words: 2M distinct, Zipf"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds the worker may take to prepare")
    ap.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = ap.parse_args(argv)
    size = args.size or (20 * MB if args.smoke else 1 << 30)
    print(
        f"upload_rss: {size / MB:,.0f} MB of {args.text}, {args.backend}, tokenizer {args.tokenizer}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="fs-bench-upload-rss-") as d:
        up, prep = measure(args, size, Path(d))
    met = report(args, size, up, prep)
    return 0 if met or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
