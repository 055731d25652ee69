"""A thread that keeps rows marked alive while this process works on them: every `interval`
seconds it sets `heartbeat_at = now` on the rows whose ids it holds (and that still match
`pending`), in a short transaction of its own. Blobs being written (core/blob_writers.py) and
completions being generated (worker/inference.py) use one each: their rows stop being refreshed
when the process dies, which is how other processes tell a dead writer or worker from a slow one.
The thread runs only while there is something to refresh.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import Session, sessionmaker

from core.models import utcnow

log = logging.getLogger(__name__)


class RowHeartbeat:
    """Ids of `model` rows (with `id` and `heartbeat_at` columns) this process is working on."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        interval: float,
        model: Any,
        pending: ColumnElement[bool],
    ) -> None:
        self.session_factory, self.interval = session_factory, interval
        self.model, self.pending = model, pending
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, row_id: str) -> None:
        with self._lock:
            self._live.add(row_id)
            if self._thread is None or not self._thread.is_alive():
                name = f"fromscratch-heartbeat-{self.model.__tablename__}"
                self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._thread.start()

    def discard(self, *row_ids: str) -> None:
        with self._lock:
            self._live.difference_update(row_ids)

    def beat(self) -> int:
        """Refresh the heartbeat of the rows held; how many it touched."""
        with self._lock:
            ids = sorted(self._live)
        if not ids:
            return 0
        with self.session_factory() as session:
            result = session.execute(
                update(self.model).where(self.model.id.in_(ids), self.pending).values(heartbeat_at=utcnow())
            )
            session.commit()
        return int(result.rowcount)  # type: ignore[attr-defined]

    def _run(self) -> None:
        while True:
            threading.Event().wait(self.interval)
            with self._lock:
                if not self._live:
                    self._thread = None  # the next add() starts a new one
                    return
            try:
                self.beat()
            except Exception as exc:  # the next beat tries again; the work itself goes on
                log.warning("could not refresh the heartbeat of %s: %s", self.model.__tablename__, exc)
