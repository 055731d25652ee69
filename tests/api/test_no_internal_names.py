"""Error messages never name the service's internal exception classes (issue 25, finding 8: the
embedded serve answered "the broker is unreachable (AttributeError)"). The classes go to the log."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from core.settings import Settings
from tests.api.conftest import SHAKESPEARE, Factory, Tenant, upload
from tests.api.test_completions_api import model_id  # noqa: F401 - a fixture, used below
from tests.api.test_errors import assert_envelope
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - a fixture, used below

CLASS_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Timeout)\b")


def _clean(message: str) -> str:
    assert not CLASS_NAME.search(message), message
    return message


def test_broker_failures_say_what_happened_without_class_names(
    settings: Settings,
    tenant: Tenant,
    factory: Factory,
    model_id: str,  # noqa: F811
) -> None:
    from api.main import create_app

    dead = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(dead)) as c:
        fid = upload(c, tenant, SHAKESPEARE.read_bytes(), "s.txt").json()["id"]
        r = c.post(
            "/v1/fine_tuning/jobs",
            json={"model": "llama-tiny", "training_file": fid},
            headers=tenant.headers,
        )
        err = assert_envelope(r, 503)
        assert err["code"] == "broker_unavailable" and "broker is unreachable" in _clean(err["message"])
        r = c.post("/v1/completions", json={"model": model_id, "prompt": "x"}, headers=tenant.headers)
        assert "broker is unreachable" in _clean(assert_envelope(r, 503)["message"])
        r = c.get(f"/v1/models/{model_id}/content", params={"format": "gguf"}, headers=tenant.headers)
        assert "broker is unreachable" in _clean(assert_envelope(r, 503)["message"])
        err = assert_envelope(c.get("/readyz"), 503)
        assert _clean(err["message"]) == "Not ready: broker unreachable"


def test_readyz_names_a_dead_database_without_its_class(settings: Settings) -> None:
    from api.main import create_app

    dead = settings.model_copy(
        update={"database_url": "postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2"}
    )
    with TestClient(create_app(dead)) as c:
        err: dict[str, Any] = assert_envelope(c.get("/readyz"), 503)
        assert _clean(err["message"]).startswith("Not ready: database unreachable")
