"""GET /v1/fine_tuning/statuses: the dashboard's status lists come from core.status through the API."""

from __future__ import annotations

from fastapi.testclient import TestClient

from core.status import ACTIVE, CLAIMABLE, TERMINAL, JobStatus
from tests.api.conftest import Tenant
from tests.api.test_errors import assert_envelope


def test_statuses_are_served_from_core(client: TestClient, tenant: Tenant) -> None:
    body = client.get("/v1/fine_tuning/statuses", headers=tenant.headers).json()
    assert body["object"] == "fine_tuning.statuses"
    assert body["statuses"] == [s.value for s in JobStatus]
    assert set(body["terminal"]) == set(TERMINAL)
    assert set(body["claimable"]) == set(CLAIMABLE)
    assert set(body["active"]) == set(ACTIVE)


def test_statuses_need_a_key(client: TestClient) -> None:
    assert_envelope(client.get("/v1/fine_tuning/statuses"), 401)
