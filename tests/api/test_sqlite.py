"""The same API on the embedded defaults (`fromscratch serve`): SQLite database + sqla broker +
blob files under the data dir."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.main import create_app
from core.keys import create_key
from core.models import Blob, BlobChunk, File, Metric
from tests.api.conftest import SHAKESPEARE, Tenant, upload
from tests.api.test_metrics_stream import parse_sse


def test_core_routes_on_sqlite(sqlite_settings: Any, sqlite_session_factory: Any) -> None:
    with sqlite_session_factory() as s:
        key, secret = create_key(s, "sqlite")
        s.commit()
        tenant = Tenant(key.owner_id, secret)
    with TestClient(create_app(sqlite_settings)) as c:
        assert c.get("/readyz").status_code == 200
        fid = upload(c, tenant, SHAKESPEARE.read_bytes(), "s.txt").json()["id"]
        assert c.get(f"/v1/files/{fid}/content", headers=tenant.headers).content == SHAKESPEARE.read_bytes()
        with sqlite_session_factory() as s:  # the bytes are a file in the data dir, not rows in SQLite
            blob = s.scalars(select(Blob).join(File, File.blob_id == Blob.id).where(File.id == fid)).one()
            assert blob.backend == "fs" and not s.scalar(select(func.count()).select_from(BlobChunk))
        assert (sqlite_settings.data_dir / "blobs" / str(blob.path)).read_bytes() == SHAKESPEARE.read_bytes()
        job = c.post(
            "/v1/fine_tuning/jobs",
            headers=tenant.headers,
            json={"model": "llama-tiny", "training_file": fid, "hyperparameters": {"max_steps": 3}},
        )
        assert job.status_code == 200, job.text
        job_id = job.json()["id"]
        with sqlite_session_factory() as s:
            s.add_all([Metric(job_id=job_id, step=i, train_loss=1.0 / i) for i in range(1, 201)])
            s.commit()
        down = c.get(f"/v1/fine_tuning/jobs/{job_id}/metrics?max_points=20", headers=tenant.headers).json()
        steps = [p["step"] for p in down["data"]]
        assert len(steps) <= 20 and steps[-1] == 200
        events = c.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=5", headers=tenant.headers).json()
        assert events["has_more"] is True and events["data"][0]["type"] == "metrics"
        assert (
            c.post(f"/v1/fine_tuning/jobs/{job_id}/cancel", headers=tenant.headers).json()["status"]
            == "cancelled"
        )
        with c.stream("GET", f"/v1/fine_tuning/jobs/{job_id}/stream", headers=tenant.headers) as r:
            got = parse_sse(r.read().decode())
        assert len([e for e in got if e["event"] == "metrics"]) == 200
        assert got[-1]["json"]["status"] == "cancelled"
        assert c.delete(f"/v1/files/{fid}", headers=tenant.headers).status_code == 200
