"""While the database cannot be reached the API answers 503 `database_unavailable` with
Retry-After in the error envelope (never 500), and /readyz says the database is what is down.
(Recovery after a real outage: tests/worker/test_db_faults.py.)"""

from __future__ import annotations

import socket
from pathlib import Path

from fastapi.testclient import TestClient

from api.main import create_app
from core.settings import Settings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket is closed


def test_database_down_answers_503(redis_url: str, tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/nothing",
        broker_url=redis_url,
        data_dir=tmp_path,
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        headers = {"Authorization": "Bearer fsk-whatever"}
        for path in ("/v1/fine_tuning/jobs", "/v1/files", "/v1/models"):
            r = client.get(path, headers=headers)
            assert r.status_code == 503, (path, r.status_code, r.text)
            error = r.json()["error"]
            assert error["code"] == "database_unavailable" and error["type"] == "server_error"
            assert "retry" in error["message"].lower()
            assert int(r.headers["retry-after"]) > 0
        ready = client.get("/readyz")
        assert ready.status_code == 503
        message = ready.json()["error"]["message"]
        assert "database unreachable" in message and "broker" not in message, message
        assert int(ready.headers["retry-after"]) > 0
        assert client.get("/healthz").status_code == 200  # the process itself is fine
