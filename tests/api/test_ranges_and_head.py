"""Downloads resume and GET routes answer HEAD (issue 25 finding 9): `Range: bytes=N-` gets 206
with the rest of a file or model, `If-Range` with a stale ETag gets the whole, a range past the end
416 naming the size; HEAD on any GET route answers the GET's status and headers without a body."""

from __future__ import annotations

import hashlib
import random
import string

from fastapi.testclient import TestClient

from tests.api.conftest import Factory, Tenant, upload
from tests.api.test_errors import assert_envelope
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - the fixture

DATA = "".join(random.Random(0).choices(string.ascii_letters + " \n", k=50_000)).encode()


def test_a_file_download_resumes_from_a_byte(client: TestClient, tenant: Tenant) -> None:
    file_id = upload(client, tenant, DATA, "data.txt").json()["id"]
    url, auth = f"/v1/files/{file_id}/content", tenant.headers
    whole = client.get(url, headers=auth)
    assert whole.status_code == 200 and whole.content == DATA
    assert whole.headers["accept-ranges"] == "bytes"
    tag = whole.headers["etag"]
    assert tag == f'"{hashlib.sha256(DATA).hexdigest()}"'
    rest = client.get(url, headers={**auth, "Range": "bytes=30000-"})
    assert rest.status_code == 206 and rest.content == DATA[30000:]
    assert rest.headers["content-range"] == f"bytes 30000-{len(DATA) - 1}/{len(DATA)}"
    assert rest.headers["content-length"] == str(len(DATA) - 30000)
    middle = client.get(url, headers={**auth, "Range": "bytes=10-19", "If-Range": tag})
    assert middle.status_code == 206 and middle.content == DATA[10:20]
    tail = client.get(url, headers={**auth, "Range": "bytes=-7"})
    assert tail.status_code == 206 and tail.content == DATA[-7:]
    stale = client.get(url, headers={**auth, "Range": "bytes=10-19", "If-Range": '"another-file"'})
    assert stale.status_code == 200 and stale.content == DATA
    several = client.get(url, headers={**auth, "Range": "bytes=0-1,5-6"})
    assert several.status_code == 200 and several.content == DATA  # one range per request
    past = client.get(url, headers={**auth, "Range": f"bytes={len(DATA)}-"})
    err = assert_envelope(past, 416)
    assert err["param"] == "Range" and f"{len(DATA):,} bytes" in err["message"]
    assert past.headers["content-range"] == f"bytes */{len(DATA)}"


def test_a_model_download_resumes_from_a_byte(
    client: TestClient,
    tenant: Tenant,
    factory: Factory,
    tiny_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    url = f"/v1/models/{model_id}/content?format=checkpoint"
    r = client.get(url, headers={**tenant.headers, "Range": "bytes=1000-"})
    assert r.status_code == 206 and r.content == tiny_checkpoint_tar[1000:]
    assert (
        r.headers["content-range"] == f"bytes 1000-{len(tiny_checkpoint_tar) - 1}/{len(tiny_checkpoint_tar)}"
    )


def test_head_answers_what_get_would_without_the_body(
    client: TestClient,
    tenant: Tenant,
    factory: Factory,
    tiny_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    file_id = upload(client, tenant, DATA, "data.txt").json()["id"]
    head = client.head(f"/v1/files/{file_id}/content", headers=tenant.headers)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(DATA)) and head.headers["etag"]
    meta = client.head(f"/v1/files/{file_id}", headers=tenant.headers)
    assert meta.status_code == 200 and meta.content == b""
    assert int(meta.headers["content-length"]) == len(
        client.get(f"/v1/files/{file_id}", headers=tenant.headers).content
    )
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    model = client.head(f"/v1/models/{model_id}/content?format=checkpoint", headers=tenant.headers)
    assert model.status_code == 200 and model.headers["content-length"] == str(len(tiny_checkpoint_tar))
    assert client.head("/v1/files/file-missing", headers=tenant.headers).status_code == 404
    assert client.head("/v1/files").status_code == 401  # no key: the GET's answer
    assert client.head("/healthz").status_code == 200
    assert client.head("/").status_code == 200  # the dashboard
    # a route with no GET still says which methods it has
    assert client.head("/v1/fine_tuning/jobs/ftjob-x/cancel", headers=tenant.headers).status_code == 405
