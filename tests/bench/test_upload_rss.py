"""bench/upload_rss.py end to end in its --smoke mode (20 MB), on each blob backend: a real
`fromscratch serve` with its worker (and, for s3, a throwaway SeaweedFS) takes the upload and
prepares a job on it, and the script prints its table with a number in every measured column. The
goals themselves are the benchmark's to judge (its --check), not this test's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
NUMBER_COLUMNS = (
    "file MB",
    "API before MB",
    "API peak MB",
    "API growth MB",
    "upload MB/s",
    "worker before MB",
    "worker peak MB",
    "tokenize s",
)


def table(stdout: str) -> dict[str, str]:
    """The last table printed, as {column: value} of its one row."""
    lines = stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("backend ")]
    assert heads, f"no table printed:\n{stdout[-3000:]}"
    i = heads[-1]
    assert lines[i + 1].startswith("---") and len(lines) > i + 2, stdout[-3000:]
    names = re.split(r"\s{2,}", lines[i].strip())
    values = re.split(r"\s{2,}", lines[i + 2].strip())
    assert len(names) == len(values), f"{names} / {values}"
    return dict(zip(names, values, strict=True))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["fs", "db", "s3"])
def test_smoke_prints_the_memory_table(backend: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FROMSCRATCH_", "AWS_"))}
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "upload_rss.py"), "--smoke", "--backend", backend],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"upload_rss --smoke failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    row = table(proc.stdout)
    assert row["backend"] == f"{backend} (SQLite)" and row["tokenizer, text"] == "byte, shakespeare"
    for column in NUMBER_COLUMNS:
        assert re.fullmatch(r"\d[\d,]*\.?\d*", row[column]), f"{column}: {row[column]!r}"
    assert float(row["file MB"]) == 20
    assert float(row["API peak MB"]) >= float(row["API before MB"]) > 0
    assert float(row["worker peak MB"]) >= float(row["worker before MB"]) > 0
    for column in ("API growth", "worker peak"):
        assert re.fullmatch(r"[✓✗] ≤ \d+", row[column]), f"{column}: {row[column]!r}"
    assert list(tmp_path.iterdir()) == [], "the benchmark left files in its TMPDIR"
