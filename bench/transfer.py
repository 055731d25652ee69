"""Upload and download of one large file through the API (POST /v1/files, GET /v1/files/{id}/content)
for both blob-store backends: MB/s (10^6 bytes) and the API process's peak RSS growth during each
transfer (goal <= 64 MB: streamed, never buffered whole).

A real `fromscratch serve --no-worker` per backend (embedded SQLite by default; `--postgres` puts the
database, and so the "db" backend's chunks, in Postgres). The client streams the file from disk and
the download to a hash, so the client never holds it either. Peak RSS is the kernel's VmHWM of the
API process, reset (/proc/PID/clear_refs) just before each transfer.

    .venv/bin/python bench/transfer.py                # 1 GiB, backends db and fs, SQLite
    .venv/bin/python bench/transfer.py --postgres     # the same with Postgres
    .venv/bin/python bench/transfer.py --smoke        # 4 MB
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._service import (
    SHAKESPEARE,
    Service,
    fresh_postgres_db,
    machine,
    print_table,
    reset_peak_rss,
    rss_kib,
    serve,
)

MB = 1_000_000


def make_file(path: Path, size: int) -> str:
    """`size` bytes of valid UTF-8 text (Shakespeare repeated); returns its sha256."""
    block = SHAKESPEARE.read_bytes()
    block = block[: block.rfind(b"\n") + 1]  # whole lines, so every cut point below is on a character
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            piece = block[:left]
            f.write(piece)
            h.update(piece)
            left -= len(piece)
    return h.hexdigest()


def upload(svc: Service, path: Path) -> tuple[str, float, float]:
    """(file id, seconds, API peak RSS growth in MB)."""
    base = reset_peak_rss(svc.pid)
    t0 = time.perf_counter()
    with open(path, "rb") as fh, httpx.Client(base_url=svc.url, headers=svc.headers, timeout=3600) as c:
        r = c.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": (path.name, fh, "text/plain")})
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    growth = (rss_kib(svc.pid, "VmHWM") - base) * 1024 / MB
    return str(r.json()["id"]), elapsed, growth


def download(svc: Service, file_id: str) -> tuple[str, int, float, float]:
    """(sha256, bytes, seconds, API peak RSS growth in MB)."""
    base = reset_peak_rss(svc.pid)
    h = hashlib.sha256()
    n = 0
    t0 = time.perf_counter()
    with (
        httpx.Client(base_url=svc.url, headers=svc.headers, timeout=3600) as c,
        c.stream("GET", f"/v1/files/{file_id}/content") as r,
    ):
        r.raise_for_status()
        for chunk in r.iter_bytes(1 << 20):
            h.update(chunk)
            n += len(chunk)
    elapsed = time.perf_counter() - t0
    growth = (rss_kib(svc.pid, "VmHWM") - base) * 1024 / MB
    return h.hexdigest(), n, elapsed, growth


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="4 MB instead of 1 GiB")
    ap.add_argument("--size", type=int, default=None, help="bytes (default 1 GiB)")
    ap.add_argument("--postgres", action="store_true", help="Postgres instead of embedded SQLite")
    ap.add_argument("--backends", default="db,fs")
    args = ap.parse_args(argv)
    size = args.size or (4 * MB if args.smoke else 1 << 30)

    rows = []
    with tempfile.TemporaryDirectory(prefix="fs-bench-transfer-") as d:
        src = Path(d) / "big.txt"
        digest = make_file(src, size)
        print(f"transfer: {size / MB:,.0f} MB file", flush=True)
        for backend in args.backends.split(","):
            with contextlib.ExitStack() as stack:
                url = stack.enter_context(fresh_postgres_db()) if args.postgres else None
                svc = stack.enter_context(
                    serve(
                        database_url=url, blob_backend=backend, worker=False, max_upload_bytes=str(size + MB)
                    )
                )
                file_id, up_s, up_mem = upload(svc, src)
                got, n, down_s, down_mem = download(svc, file_id)
                if got != digest or n != size:
                    raise SystemExit(f"download of {file_id} differs from the upload ({n} bytes)")
                db = "Postgres" if args.postgres else "SQLite"
                for what, secs, mem in (("upload", up_s, up_mem), ("download", down_s, down_mem)):
                    print(
                        f"  {backend} ({db}) {what}: {size / MB / secs:,.1f} MB/s, API peak RSS +{mem:.1f} MB",
                        flush=True,
                    )
                    rows.append(
                        (
                            f"{backend} ({db})",
                            what,
                            f"{size / MB:,.0f}",
                            f"{secs:.1f}",
                            f"{size / MB / secs:,.1f}",
                            f"{mem:.1f}",
                            "yes" if mem <= 64 else "NO",
                        )
                    )
    print()
    print(
        f"# transfer  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {machine()}; one file through the API, "
        "sha256 checked"
    )
    print_table(("backend", "direction", "MB", "s", "MB/s", "API RSS +MB", "<=64 MB"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
