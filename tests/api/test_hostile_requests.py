"""The inputs that used to answer 500, and the other hostile or unlucky requests of issue 9: each is a
4xx in the error envelope naming what is wrong, quotes little of what was sent, and leaves nothing
behind (no temp file, no secret in the log)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import Factory, Tenant, upload
from tests.api.test_errors import assert_envelope

JOBS = "/v1/fine_tuning/jobs"


def post_json(client: TestClient, path: str, text: str, tenant: Tenant, **headers: str) -> Any:
    """POST a JSON body given as text (json= would refuse to encode a lone surrogate)."""
    return client.post(
        path,
        content=text.encode("utf-8"),
        headers={**tenant.headers, "Content-Type": "application/json", **headers},
    )


# ------------------------------------------------------------------------------- lone surrogates
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"model":"llama-tiny","training_file":"\\ud800"}', "training_file"),
        ('{"model":"\\udfff","training_file":"file-x"}', "model"),
        (
            '{"model":"llama-tiny","training_file":"file-x","hyperparameters":{"\\ud800":1}}',
            "hyperparameters",
        ),
        ('{"model":"llama-tiny","training_file":"file-x","metadata":{"a":"ok\\ud800"}}', "metadata.a"),
        ('{"model":"llama-tiny","training_file":"file-x","integrations":["\\udc00"]}', "integrations.0"),
        ('{"\\ud83d":1}', None),
    ],
)
def test_lone_surrogate_in_a_job_is_400_naming_the_field(
    client: TestClient, tenant: Tenant, body: str, param: str | None
) -> None:
    err = assert_envelope(post_json(client, JOBS, body, tenant), 400)
    assert (err["param"], err["code"]) == (param, "invalid_text")
    assert "surrogate" in err["message"] or param is None


def test_an_integer_past_pythons_digit_limit_is_400_saying_so(client: TestClient, tenant: Tenant) -> None:
    body = '{"model":"llama-tiny","training_file":"file-x","seed":' + "9" * 5000 + "}"
    err = assert_envelope(post_json(client, JOBS, body, tenant), 400)
    assert err["code"] == "invalid_json" and "an integer of more than 4300 digits" in err["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"model":"llama-tiny","training_file":"file-\\u0000x"}', "training_file"),
        ('{"model":"llama-tiny","training_file":"f","metadata":{"k\\u0000":"v"}}', "metadata"),
    ],
)
def test_nul_in_a_json_string_is_400(client: TestClient, tenant: Tenant, body: str, param: str) -> None:
    """PostgreSQL text cannot hold NUL: an id compared with one used to fail the query (a 500)."""
    err = assert_envelope(post_json(client, JOBS, body, tenant), 400)
    assert (err["param"], err["code"]) == (param, "invalid_text") and "NUL" in err["message"]


def test_nul_in_a_url_is_400(client: TestClient, tenant: Tenant) -> None:
    err = assert_envelope(client.get("/v1/files?after=file-%00&limit=5", headers=tenant.headers), 400)
    assert (err["param"], err["code"]) == ("after", "invalid_text")
    err = assert_envelope(client.get("/v1/files/file-%00x", headers=tenant.headers), 400)
    assert (err["param"], err["code"]) == (None, "invalid_text")
    err = assert_envelope(client.get(f"{JOBS}/x%00/metrics", headers=tenant.headers), 400)
    assert err["code"] == "invalid_text"


def test_lone_surrogate_in_a_prompt_is_400_and_a_pair_is_text(client: TestClient, tenant: Tenant) -> None:
    url = "/v1/models/ft:llama-tiny:none/generate"
    err = assert_envelope(post_json(client, url, '{"prompt":"\\ud800 hi"}', tenant), 400)
    assert (err["param"], err["code"]) == ("prompt", "invalid_text")
    # raw CESU-8 bytes of a surrogate (which Python's json decoder lets through) too
    raw = client.post(
        url,
        content=b'{"prompt":"\xed\xa0\x80"}',
        headers={**tenant.headers, "Content-Type": "application/json"},
    )
    assert assert_envelope(raw, 400)["param"] == "prompt"
    # a surrogate pair is one valid character (an emoji): the request gets past the check
    assert_envelope(post_json(client, url, '{"prompt":"\\ud83d\\ude00"}', tenant), 404)


# ---------------------------------------------------------------------------- what errors echo
def test_errors_quote_at_most_a_little_of_the_input(client: TestClient, tenant: Tenant) -> None:
    big = "m" * 1_000_000
    r = client.post(JOBS, json={"model": big, "training_file": "file-x"}, headers=tenant.headers)
    assert assert_envelope(r, 400)["param"] == "model" and len(r.content) < 1000
    r = client.post(
        JOBS,
        json={"model": "llama-tiny", "training_file": "file-x", "hyperparameters": {big: 1}},
        headers=tenant.headers,
    )
    assert r.status_code == 400 and len(r.content) < 3000, len(r.content)
    for path in ("/v1/files/" + "f" * 30_000, "/v1/nope/" + "n" * 30_000, "/v1/models/" + "x" * 30_000):
        r = client.get(path, headers=tenant.headers)
        assert assert_envelope(r, 404) and len(r.content) < 1000, (path[:20], len(r.content))
    # a JSON body past the limit is cut off unread
    r = client.post(JOBS, json={"model": "m" * 2_000_000, "training_file": "x"}, headers=tenant.headers)
    assert assert_envelope(r, 413)["code"] == "too_large"


# --------------------------------------------------------------------------------------- uploads
def raw_upload(client: TestClient, tenant: Tenant, filename: bytes) -> Any:
    """An upload whose Content-Disposition carries `filename` byte for byte (httpx would escape it)."""
    body = (
        b'--bnd\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
        b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="'
        + filename
        + b'"\r\n\r\n'
        + b"hello world\n" * 20
        + b"\r\n--bnd--\r\n"
    )
    return client.post(
        "/v1/files",
        content=body,
        headers={**tenant.headers, "Content-Type": "multipart/form-data; boundary=bnd"},
    )


def test_filename_loses_control_characters(client: TestClient, tenant: Tenant) -> None:
    r = raw_upload(client, tenant, "a\x00b\x01c\x1b[31m\u202etxt.exe".encode())
    assert r.status_code == 200, r.text
    assert r.json()["filename"] == "abc[31mtxt.exe"
    r = raw_upload(client, tenant, b"\x00\x07")
    assert r.status_code == 200 and r.json()["filename"] == "upload"


def test_an_empty_file_is_named_as_the_user_named_it(client: TestClient, tenant: Tenant) -> None:
    err = assert_envelope(upload(client, tenant, b"", filename="empty.txt"), 400)
    assert err["code"] == "invalid_file" and "'empty.txt'" in err["message"]
    assert "upload-" not in err["message"], err["message"]


BOUNDARY = "hostileboundary"
HEAD = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="slow.txt"\r\n\r\n'
).encode()


def asgi_upload(app: Any, tenant: Tenant, chunks: list[bytes], then: str) -> tuple[int, dict[str, str], Any]:
    """POST /v1/files that sends `chunks` and then goes `then`: "silent" (waits for ever) or
    "away" (disconnects). Returns (status, response headers, error object)."""
    messages = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        if then == "silent":
            await anyio.sleep_forever()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/files",
        "raw_path": b"/v1/files",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {tenant.secret}".encode()),
            (b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode()),
            (b"content-length", b"1000000"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }

    async def run() -> None:
        with anyio.fail_after(30):  # the test's own bound: the app must answer well before
            await app(scope, receive, send)

    anyio.run(run)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return int(start["status"]), headers, json.loads(body)["error"]


def _uploads_left(app: Any) -> list[Path]:
    folder = Path(app.state.settings.work_dir) / "uploads"
    return list(folder.iterdir()) if folder.exists() else []


def test_a_silent_upload_times_out_with_408_and_leaves_nothing(settings: Any, tenant: Tenant) -> None:
    app = create_app(settings.model_copy(update={"upload_body_timeout_seconds": 0.5}))
    status, headers, err = asgi_upload(app, tenant, [HEAD, b"a" * 100], then="silent")
    assert (status, err["code"], err["param"]) == (408, "upload_timeout", "file")
    assert headers.get("connection") == "close"
    assert _uploads_left(app) == []


def test_a_client_that_goes_away_is_one_log_line(
    settings: Any, tenant: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings)
    with caplog.at_level(logging.INFO, logger="fromscratch.api"):
        status, _, err = asgi_upload(app, tenant, [HEAD, b"a" * 5000], then="away")
    assert (status, err["code"]) == (400, "upload_aborted")
    records = [r for r in caplog.records if r.name == "fromscratch.api"]
    assert len(records) == 1 and records[0].exc_info is None, [r.getMessage() for r in records]
    assert "aborted by the client" in records[0].getMessage()
    assert _uploads_left(app) == []


# --------------------------------------------------------------------------------- idempotency
def test_idempotency_key_reused_with_another_body_is_400(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    file_id = factory.file(tenant.owner_id)
    headers = {**tenant.headers, "Idempotency-Key": "create-once"}
    body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": {"max_steps": 3}}
    first = client.post(JOBS, json=body, headers=headers)
    assert first.status_code == 200, first.text
    # the same request again (keys in another order, an explicit null): the same job
    again = {
        "hyperparameters": {"max_steps": 3},
        "training_file": file_id,
        "model": "llama-tiny",
        "seed": None,
    }
    assert client.post(JOBS, json=again, headers=headers).json()["id"] == first.json()["id"]
    other = {**body, "hyperparameters": {"max_steps": 4}}
    err = assert_envelope(client.post(JOBS, json=other, headers=headers), 400)
    assert (err["code"], err["param"]) == ("idempotency_key_reused", "Idempotency-Key")
    assert first.json()["id"] in err["message"]


# ----------------------------------------------------------------------------------------- logs
def test_access_log_never_shows_a_key() -> None:
    from uvicorn.logging import AccessFormatter

    from api.logs import install_log_redaction

    install_log_redaction()
    logger = logging.getLogger("uvicorn.access")
    record = logger.makeRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        (
            "127.0.0.1:5000",
            "GET",
            "/v1/fine_tuning/jobs/j/stream?last_event_id=1.2&api_key=fsk-SECRETSECRET&x=%61pi_key",
            "1.1",
            200,
        ),
        None,
    )
    for f in logger.filters:
        f.filter(record)
    line = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False).format(
        record
    )
    assert "SECRET" not in line and "api_key=***" in line and "last_event_id=1.2" in line, line
