"""`MetricsFile`: the run's metrics.jsonl, one JSON object per line: `{step, <metric>: value, ...,
time}` for each logged step, evaluation and final full validation pass, the metrics named as the
registry names them (trainer.config.metrics)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainer.config.metrics import Measured, values


class MetricsFile:
    """Appends records to metrics.jsonl. A fresh run (keep_upto None) starts it empty; a resumed run
    drops the lines past the resumed step (logged after the last checkpoint of the interrupted run)
    so the file reads as one run."""

    def __init__(self, path: Path, keep_upto: int | None):
        if keep_upto is not None and path.exists():
            kept = []
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= keep_upto:
                        kept.append(line)
                except ValueError:
                    continue  # a torn last line from a crash
            path.write_text("".join(k + "\n" for k in kept))
        elif keep_upto is None:
            path.write_text("")
        self._f = open(path, "a", encoding="utf-8")  # closed in close()

    def write(self, measured: Measured) -> None:
        record = {"step": measured.step, **values(measured), "time": time.time()}
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class NoMetricsFile(MetricsFile):
    """Writes nothing: what the ranks other than 0 of a distributed run report to."""

    def __init__(self) -> None:
        pass

    def write(self, measured: Measured) -> None:
        pass

    def close(self) -> None:
        pass
