"""One huge request header against the API server (issue 25, finding 1): the flooding request's
answer and time, `/healthz` latency on another connection meanwhile, and the server's RSS growth.

The server is the production command (docker-compose.yml's api service: uvicorn with
`--http api.http_server:BoundedHeadProtocol`) on a loopback port, settings from a throwaway data
dir; `--protocols` also runs it with uvicorn's default protocol (`auto`: httptools), as it was
before, side by side. Goal: the bounded server answers 431 at once, `/healthz` max stays under
0.5 s and the RSS grows by under 16 MB.

    .venv/bin/python bench/header_flood.py                  # 100 MB header, both protocols
    .venv/bin/python bench/header_flood.py --smoke          # 4 MB
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._service import free_port, machine, median, print_table
from tests.fixtures.head_flood import Poller, api_server_cmd, flood

BOUNDED = "api.http_server:BoundedHeadProtocol"


def run_one(http: str | None, header_bytes: int) -> tuple[str, ...]:
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
        env["FROMSCRATCH_DATA_DIR"] = data_dir
        cmd = api_server_cmd(port, sys.executable, http=http)
        server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/healthz"
            _wait_up(url)
            with Poller(url, server.pid) as idle:
                time.sleep(1.0)
            with Poller(url, server.pid) as poller:
                result = flood(port, header_bytes)
                time.sleep(0.5)
        finally:
            server.terminate()
            server.wait(timeout=30)
    base = median([float(x) for x in idle.rss_kib])
    growth = (max(poller.rss_kib, default=0) - base) / 1024
    name = http or "production"
    return (
        name,
        str(result.status),
        "yes" if result.cut_off else "no",
        f"{result.sent / 1e6:.1f}",
        f"{result.seconds:.2f}",
        f"{median(idle.latencies) * 1000:.1f}",
        f"{median(poller.latencies) * 1000:.1f}",
        f"{max(poller.latencies, default=float('nan')) * 1000:.0f}",
        str(len(poller.failures)),
        f"{growth:.1f}",
    )


def _wait_up(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--header-mb", type=float, default=100.0, help="size of the one header (MB)")
    parser.add_argument(
        "--protocols",
        default="auto,production",
        help="comma-separated: production (the compose command as it is), or a uvicorn --http value",
    )
    parser.add_argument("--smoke", action="store_true", help="a 4 MB header, production only")
    args = parser.parse_args()
    header_bytes = int((4.0 if args.smoke else args.header_mb) * 1e6)
    protocols = ["production"] if args.smoke else args.protocols.split(",")
    rows = [run_one(None if p == "production" else p, header_bytes) for p in protocols]
    print(f"header flood: one {header_bytes / 1e6:.0f} MB header; {machine()}")
    print_table(
        (
            "server",
            "status",
            "cut off",
            "MB taken",
            "answer s",
            "healthz idle ms",
            "healthz p50 ms",
            "healthz max ms",
            "failed",
            "RSS growth MB",
        ),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
