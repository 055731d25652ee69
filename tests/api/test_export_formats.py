"""GET /v1/fine_tuning/export_formats: the download formats and dtypes come from
trainer.config.export_formats (and core.exports' `checkpoint`) through the API, and they are the
values the download endpoint accepts."""

from __future__ import annotations

from fastapi.testclient import TestClient

from core.exports import DOWNLOAD_FORMATS
from tests.api.conftest import Tenant
from tests.api.test_errors import assert_envelope
from trainer.config import TrainConfig
from trainer.config.export_formats import DTYPE_NAMES, FORMATS


def test_export_formats_are_served_from_the_one_list(client: TestClient, tenant: Tenant) -> None:
    body = client.get("/v1/fine_tuning/export_formats", headers=tenant.headers).json()
    assert body["object"] == "fine_tuning.export_formats"
    served = {f["name"]: f for f in body["formats"]}
    assert list(served) == list(DOWNLOAD_FORMATS) == [f.name for f in FORMATS] + ["checkpoint"]
    for spec in FORMATS:
        assert served[spec.name]["dtypes"] == list(spec.dtypes)
        assert served[spec.name]["title"] == spec.title
    assert served["hf"]["extension"] == "tar" and served["hf"]["media_type"] == "application/x-tar"
    assert served["gguf"]["extension"] == "gguf"
    assert served["checkpoint"]["dtypes"] == [] and served["checkpoint"]["extension"] == "tar"
    assert [d["name"] for d in body["dtypes"]] == list(DTYPE_NAMES)
    assert (body["default_format"], body["default_dtype"], body["job_end_dtype"]) == ("gguf", "f32", "f32")
    assert body["made_at_job_end"] == TrainConfig().export_formats == ["gguf", "hf"]


def test_the_download_parameters_take_exactly_the_served_names(client: TestClient, tenant: Tenant) -> None:
    body = client.get("/v1/fine_tuning/export_formats", headers=tenant.headers).json()
    spec = client.get("/openapi.json").json()
    content = spec["paths"]["/v1/models/{model_id}/content"]["get"]
    schemas = {p["name"]: p["schema"] for p in content["parameters"] if p["in"] == "query"}
    assert schemas["format"]["enum"] == [f["name"] for f in body["formats"]]
    assert schemas["dtype"]["enum"] == [d["name"] for d in body["dtypes"]]
    assert "/v1/fine_tuning/export_formats" in spec["paths"]


def test_export_formats_need_a_key(client: TestClient) -> None:
    assert_envelope(client.get("/v1/fine_tuning/export_formats"), 401)
