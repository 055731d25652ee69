"""JSON nesting is bounded (issue 25, finding 5): a JSONL record or a request body nested deeper than
the setting `max_json_depth` (64) is a 400 naming the line and the limit; 1,000 levels used to be a
RecursionError out of the parser, a 500 that the SDK retries."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Tenant, upload
from tests.api.test_errors import assert_envelope
from tests.api.test_files import _rejected
from trainer.data.formats import JSONTooDeep, validate_file


def nested(depth: int) -> str:
    """A record `depth` levels deep: an object holding depth - 1 arrays inside one another."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return f'{{"text": "deep", "extra": {inner}}}'


@pytest.mark.parametrize("filename", ["deep.jsonl", "deep.txt"])
def test_a_jsonl_line_1000_deep_is_a_400_naming_the_line_and_the_limit(
    client: TestClient, tenant: Tenant, session_factory: Any, filename: str
) -> None:
    body = f'{{"text": "ok"}}\n{nested(1000)}\n'.encode()
    err = _rejected(client, tenant, session_factory, body, filename)
    assert err["param"] == "file" and err["code"] == "invalid_file"
    assert "line 2" in err["message"] and "64 levels" in err["message"], err
    assert "FROMSCRATCH_MAX_JSON_DEPTH" in err["message"]
    first = _rejected(client, tenant, session_factory, f"{nested(1000)}\n".encode(), filename)
    assert "line 1" in first["message"]  # the line format detection reads first


def test_the_limit_is_the_setting(settings: Any, tenant: Tenant, session_factory: Any) -> None:
    from api.main import create_app

    with TestClient(create_app(settings.model_copy(update={"max_json_depth": 8}))) as c:
        err = _rejected(c, tenant, session_factory, f"{nested(9)}\n".encode(), "over.jsonl")
        assert "8 levels" in err["message"]
    with TestClient(create_app(settings)) as c:
        err = _rejected(c, tenant, session_factory, f"{nested(65)}\n".encode(), "over.jsonl")
        assert "line 1" in err["message"] and "64 levels" in err["message"]
        assert upload(c, tenant, f"{nested(64)}\n".encode(), "at.jsonl").status_code == 200


def test_a_request_body_1000_deep_is_a_400_naming_the_limit(client: TestClient, tenant: Tenant) -> None:
    deep = "[" * 1000 + "]" * 1000
    body = f'{{"model": "llama-tiny", "training_file": "file-x", "metadata": {deep}}}'
    r = client.post(
        "/v1/fine_tuning/jobs",
        content=body,
        headers={**tenant.headers, "Content-Type": "application/json"},
    )
    err = assert_envelope(r, 400)
    assert err["code"] == "json_too_deep"
    assert "64 levels" in err["message"] and "FROMSCRATCH_MAX_JSON_DEPTH" in err["message"]
    r = client.post(
        "/v1/completions",
        content=f'{{"model": "m", "prompt": {"[" * 65 + "]" * 65}}}',
        headers={**tenant.headers, "Content-Type": "application/json"},
    )
    assert assert_envelope(r, 400)["code"] == "json_too_deep"


def test_the_worker_side_parse_names_the_line_too(tmp_path: Any) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text(f'{{"text": "ok"}}\n\n{nested(5000)}\n')
    with pytest.raises(JSONTooDeep) as caught:
        validate_file(path)
    assert caught.value.line == 3
