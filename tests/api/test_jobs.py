"""POST/GET /v1/fine_tuning/jobs: validation (400 + param, no job row), idempotency, pagination,
OpenAI's fields, cancel/pause/resume through the state machine, continue training."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from core.models import Job
from tests.api.conftest import SHAKESPEARE, Factory, Tenant, count, upload
from tests.api.test_errors import assert_envelope
from trainer.config import TrainConfig, model_config_from_preset, schema

JOBS = "/v1/fine_tuning/jobs"


@pytest.fixture
def file_id(client: TestClient, tenant: Tenant) -> str:
    r = upload(client, tenant, SHAKESPEARE.read_bytes(), "shakespeare.txt")
    assert r.status_code == 200, r.text
    return r.json()["id"]


def create(client: TestClient, tenant: Tenant, body: dict[str, Any], **headers: str) -> Any:
    return client.post(JOBS, headers={**tenant.headers, **headers}, json=body)


def test_create_job_openai_shape_and_enqueued(
    client: TestClient, tenant: Tenant, file_id: str, settings: Any, session_factory: Any
) -> None:
    r = redis.Redis.from_url(settings.broker_url)
    before = r.llen("cpu")
    resp = create(
        client,
        tenant,
        {
            "model": "llama-tiny",
            "training_file": file_id,
            "seed": 7,
            "suffix": "mine",
            "metadata": {"team": "a"},
            "hyperparameters": {
                "max_steps": 20,
                "n_embd": 96,
                "n_head": 4,
                "learning_rate": 0.002,
                "batch_size": 4,
            },
        },
    )
    assert resp.status_code == 200, resp.text
    job = resp.json()
    assert job["object"] == "fine_tuning.job" and job["id"].startswith("ftjob-")
    assert job["status"] == "queued"  # waiting for a worker
    assert job["model"] == "llama-tiny" and job["training_file"] == file_id and job["validation_file"] is None
    assert job["seed"] == 7 and job["metadata"] == {"team": "a"} and job["suffix"] == "mine"
    assert job["fine_tuned_model"] is None and job["finished_at"] is None and job["error"] is None
    assert job["organization_id"] == tenant.owner_id and job["result_files"] == []
    hp = job["hyperparameters"]
    assert hp["n_epochs"] == "auto" and hp["batch_size"] == 4 and hp["learning_rate_multiplier"] == 1.0
    assert hp["n_embd"] == 96 and hp["max_steps"] == 20
    assert job["method"] == {"type": "supervised", "supervised": {"hyperparameters": hp}}
    assert job["config"]["model"]["n_embd"] == 96 and job["config"]["train"]["seed"] == 7
    assert job["config"]["train"]["learning_rate"] == pytest.approx(0.002)
    assert set(job["progress"]) == {
        "step",
        "total_steps",
        "train_loss",
        "val_loss",
        "tokens_per_s",
        "eta_seconds",
    }
    assert r.llen("cpu") == before + 1  # the message went out after the commit
    with session_factory() as s:
        row = s.get(Job, job["id"])
        assert row is not None and row.queue == "cpu"
    got = client.get(f"{JOBS}/{job['id']}", headers=tenant.headers).json()
    assert got["id"] == job["id"] and got["status"] == "queued"
    events = client.get(f"{JOBS}/{job['id']}/events", headers=tenant.headers).json()["data"]
    assert any("Created fine-tuning job" in e["message"] for e in events)


def test_method_supervised_and_multiplier(client: TestClient, tenant: Tenant, file_id: str) -> None:
    resp = create(
        client,
        tenant,
        {
            "model": "llama-tiny",
            "training_file": file_id,
            "method": {
                "type": "supervised",
                "supervised": {"hyperparameters": {"learning_rate_multiplier": 2, "n_epochs": 3}},
            },
        },
    )
    assert resp.status_code == 200, resp.text
    job = resp.json()
    assert job["config"]["train"]["learning_rate"] == pytest.approx(2e-3)
    assert job["config"]["train"]["n_epochs"] == 3
    assert job["hyperparameters"]["n_epochs"] == 3
    # an integral float for an integer is shown as the integer the config holds
    body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": {"max_steps": 5.0}}
    shown = create(client, tenant, body).json()["hyperparameters"]["max_steps"]
    assert shown == 5 and type(shown) is int, shown
    # the multiplier scales the optimizer's own default: L-BFGS's is 1, not AdamW's 1e-3
    lbfgs = {"optimizer": "lbfgs", "learning_rate_multiplier": 2}
    resp = create(client, tenant, {"model": "llama-tiny", "training_file": file_id, "hyperparameters": lbfgs})
    assert resp.json()["config"]["train"]["learning_rate"] == pytest.approx(2.0), resp.text


@pytest.mark.parametrize(
    ("body_update", "param", "fragment"),
    [
        ({"hyperparameters": {"n_embd": 100, "n_head": 3}}, "n_embd", "divisible"),
        ({"hyperparameters": {"n_head": 3}}, "n_head", "divisible"),  # the preset's n_embd: n_head is wrong
        ({"hyperparameters": {"learning_rate": -0.1}}, "learning_rate", "positive"),
        ({"hyperparameters": {"bogus_knob": 1}}, "bogus_knob", "Unknown hyperparameter"),
        ({"hyperparameters": {"max_step": 5}}, "max_step", "did you mean max_steps?"),
        # past the service's limit or past the trainer's bound too: the same limit in the same words
        (
            {"hyperparameters": {"max_steps": 2_000_000}},
            "max_steps",
            "than the 1,000,000 steps a job may run",
        ),
        ({"hyperparameters": {"max_steps": 10**9}}, "max_steps", "than the 1,000,000 steps a job may run"),
        ({"hyperparameters": {"max_steps": "ten"}}, "max_steps", "integer"),
        ({"hyperparameters": {"n_epochs": 0}}, "n_epochs", "positive"),
        ({"hyperparameters": {"schedule": "zigzag"}}, "schedule", "one of"),
        ({"hyperparameters": {"seed": 3}}, "seed", "top-level"),
        ({"hyperparameters": {"ctx": 100_000}}, "ctx", "longer than the training data"),
        ({"model": "llama-9000"}, "model", "Unknown model"),
        ({"model": None}, "model", "required"),
        ({"training_file": "file-doesnotexist"}, "training_file", "no such file"),
        ({"training_file": None}, "training_file", "required"),
        ({"validation_file": "file-nope"}, "validation_file", "no such file"),
        ({"seed": -1}, "seed", "seed"),
        ({"suffix": "a:b"}, "suffix", "suffix"),
        ({"metadata": {"k": 1}}, "metadata", "metadata"),
        ({"surprise": True}, "surprise", "Unrecognized"),
        ({"method": {"type": "dpo"}}, "method.type", "supervised"),
        (
            {
                "hyperparameters": {"n_epochs": 1},
                "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}},
            },
            "hyperparameters",
            "not both",
        ),
    ],
)
def test_invalid_requests_are_400_with_param_and_no_job(
    client: TestClient,
    tenant: Tenant,
    file_id: str,
    session_factory: Any,
    body_update: dict[str, Any],
    param: str,
    fragment: str,
) -> None:
    body = {"model": "llama-tiny", "training_file": file_id, **body_update}
    err = assert_envelope(create(client, tenant, body), 400)
    assert err["param"] == param, err
    assert fragment.lower() in err["message"].lower(), err
    assert count(session_factory, Job, Job.owner_id == tenant.owner_id) == 0


def test_foreign_file_is_rejected(
    client: TestClient, tenant: Tenant, other: Tenant, file_id: str, session_factory: Any
) -> None:
    err = assert_envelope(create(client, other, {"model": "llama-tiny", "training_file": file_id}), 400)
    assert err["param"] == "training_file"
    assert count(session_factory, Job, Job.owner_id == other.owner_id) == 0


def test_ctx_checked_against_small_file(client: TestClient, tenant: Tenant) -> None:
    small = upload(client, tenant, b"x" * 300, "small.txt").json()["id"]
    # 300 bytes, val_fraction 0.1 -> 270 training tokens: ctx 128 fits, ctx 300 does not
    ok = create(
        client, tenant, {"model": "llama-tiny", "training_file": small, "hyperparameters": {"eval_every": 0}}
    )
    assert ok.status_code == 200, ok.text
    err = assert_envelope(
        create(
            client, tenant, {"model": "llama-tiny", "training_file": small, "hyperparameters": {"ctx": 300}}
        ),
        400,
    )
    assert err["param"] == "ctx" and "Use ctx <= 269 or more training data." in err["message"]
    # a file too small for any useful context: no ctx is suggested, more data is
    tiny = upload(client, tenant, b"hi", "tiny.txt").json()["id"]
    body = {"model": "llama-tiny", "training_file": tiny, "hyperparameters": {"eval_every": 0}}
    err = assert_envelope(create(client, tenant, body), 400)
    assert err["param"] == "ctx" and err["message"].endswith("Use more training data."), err
    # the 30-token validation split cannot hold a window of 129 tokens while evaluation is on
    err = assert_envelope(create(client, tenant, {"model": "llama-tiny", "training_file": small}), 400)
    assert err["param"] == "ctx" and err["message"].endswith(
        "Use ctx <= 29, more validation data or eval_every=0 to skip evaluation."
    ), err


def test_idempotency_key_returns_the_same_job(
    client: TestClient, tenant: Tenant, file_id: str, session_factory: Any
) -> None:
    body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": {"max_steps": 5}}
    first = create(client, tenant, body, **{"Idempotency-Key": "retry-1"})
    second = create(client, tenant, body, **{"Idempotency-Key": "retry-1"})
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    third = create(client, tenant, body, **{"Idempotency-Key": "retry-2"})
    assert third.json()["id"] != first.json()["id"]
    assert count(session_factory, Job, Job.owner_id == tenant.owner_id) == 2


def test_list_pagination_newest_first(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    ids = [factory.job(tenant.owner_id, status="queued") for _ in range(5)]
    seen: list[str] = []
    after = None
    while True:
        url = f"{JOBS}?limit=2" + (f"&after={after}" if after else "")
        page = client.get(url, headers=tenant.headers).json()
        assert page["object"] == "list"
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert seen == ids[::-1]
    assert (
        assert_envelope(client.get(f"{JOBS}?after=ftjob-nope", headers=tenant.headers), 400)["param"]
        == "after"
    )
    assert assert_envelope(client.get(f"{JOBS}?limit=0", headers=tenant.headers), 400)["param"] == "limit"


def test_pause_resume_cancel(client: TestClient, tenant: Tenant, factory: Factory, settings: Any) -> None:
    job_id = factory.job(tenant.owner_id, status="queued")
    r = client.post(f"{JOBS}/{job_id}/pause", headers=tenant.headers)
    assert r.status_code == 200 and r.json()["status"] == "paused"
    # resuming a paused job queues it again and sends it to the broker
    q = redis.Redis.from_url(settings.broker_url)
    before = q.llen("cpu")
    r = client.post(f"{JOBS}/{job_id}/resume", headers=tenant.headers)
    assert r.status_code == 200 and r.json()["status"] == "queued"
    assert q.llen("cpu") == before + 1
    err = assert_envelope(client.post(f"{JOBS}/{job_id}/resume", headers=tenant.headers), 400)
    assert "not paused" in err["message"]
    r = client.post(f"{JOBS}/{job_id}/cancel", headers=tenant.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["finished_at"] is not None
    assert client.post(f"{JOBS}/{job_id}/cancel", headers=tenant.headers).json()["status"] == "cancelled"
    for action in ("pause", "resume"):
        assert_envelope(client.post(f"{JOBS}/{job_id}/{action}", headers=tenant.headers), 400)


def test_cancel_of_a_held_job_is_final_at_once(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id = factory.job(tenant.owner_id, status="running", lease_owner="worker-x")
    r = client.post(f"{JOBS}/{job_id}/cancel", headers=tenant.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["finished_at"] is not None
    assert client.get(f"{JOBS}/{job_id}", headers=tenant.headers).json()["status"] == "cancelled"
    listed = client.get(f"{JOBS}?status=cancelled", headers=tenant.headers).json()["data"]
    assert job_id in [j["id"] for j in listed]
    assert client.get(f"{JOBS}?status=running", headers=tenant.headers).json()["data"] == []
    factory.set_status(job_id, "succeeded")  # its worker finished meanwhile: it only lets go
    again = client.post(f"{JOBS}/{job_id}/cancel", headers=tenant.headers)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    assert again.json()["fine_tuned_model"] is None and again.json()["result_files"] == []
    done = factory.job(tenant.owner_id, status="succeeded")
    err = assert_envelope(client.post(f"{JOBS}/{done}/cancel", headers=tenant.headers), 400)
    assert "succeeded" in err["message"]


def test_failed_job_shows_error_and_progress(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id = factory.job(
        tenant.owner_id, status="running", step=40, total_steps=100, train_loss=2.0, tokens_per_s=2048.0
    )
    job = client.get(f"{JOBS}/{job_id}", headers=tenant.headers).json()
    # llama-tiny ctx 128 x batch 16 = 2048 tokens per step at 2048 tokens/s: 60 steps left = 60 s
    assert job["progress"]["step"] == 40 and job["progress"]["eta_seconds"] == pytest.approx(60.0)
    assert job["estimated_finish"] is not None
    factory.set_status(
        job_id, "failed", error_code="nan_loss", error_message="loss became NaN", error_param=None
    )
    job = client.get(f"{JOBS}/{job_id}", headers=tenant.headers).json()
    assert job["status"] == "failed"
    assert job["error"] == {"code": "nan_loss", "message": "loss became NaN", "param": None}


def test_continue_training_from_own_model(
    client: TestClient, tenant: Tenant, other: Tenant, factory: Factory, file_id: str, session_factory: Any
) -> None:
    _, model_id = factory.finished_model(tenant.owner_id)
    err = assert_envelope(
        create(
            client, tenant, {"model": model_id, "training_file": file_id, "hyperparameters": {"n_embd": 128}}
        ),
        400,
    )
    assert err["param"] == "n_embd" and "it has n_embd 64, not 128" in err["message"]
    # the model's own values, as the script that started it sends them again, are no change
    same = {"max_steps": 5, "n_embd": 64, "n_layer": 2.0, "tokenizer": "byte", "vocab_size": None}
    r = create(client, tenant, {"model": model_id, "training_file": file_id, "hyperparameters": same})
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["model"] == model_id and job["base_model"] == model_id
    assert job["config"]["model"]["n_embd"] == 64
    ckpt_model = f"{model_id}:ckpt-step-50"
    assert create(client, tenant, {"model": ckpt_model, "training_file": file_id}).status_code == 200
    # another owner cannot build on it (and learns nothing about it)
    other_file = upload(client, other, b"some words here\n" * 200, "o.txt").json()["id"]
    err = assert_envelope(create(client, other, {"model": model_id, "training_file": other_file}), 400)
    assert err["param"] == "model"


def test_presets_listed(client: TestClient, tenant: Tenant) -> None:
    body = client.get("/v1/fine_tuning/presets", headers=tenant.headers).json()
    names = [p["id"] for p in body["data"]]
    assert "llama-tiny" in names
    assert body["hyperparameters"]["learning_rate"] == 1e-3


def test_presets_answer_the_defaults_a_job_gets(client: TestClient, tenant: Tenant, file_id: str) -> None:
    body = client.get("/v1/fine_tuning/presets", headers=tenant.headers).json()
    defaults = body["hyperparameters"]
    accepted = {h.name for h in schema.job_hyperparameters() if h.section == "train"}
    assert set(defaults) == accepted  # no architecture, no `seed` (the request's own), nothing removed
    assert defaults["n_epochs"] == "auto" and defaults["learning_rate_multiplier"] == 1.0
    job = create(client, tenant, {"model": "llama-tiny", "training_file": file_id}).json()
    train = job["config"]["train"]
    assert train["n_epochs"] is None  # "auto": unset, so max_steps decides the length
    # every field whose default is unset and that takes "auto" answers "auto" and is stored unset
    unset_autos = {h.name for h in schema.job_hyperparameters() if h.accepts_auto and h.default is None}
    assert "n_epochs" in unset_autos
    for name, value in defaults.items():
        if name in unset_autos:
            assert value == "auto" and train[name] is None, name
        elif name != schema.LEARNING_RATE_MULTIPLIER:  # the multiplier is no train field
            assert train[name] == value, name
    for preset in body["data"]:
        architecture = model_config_from_preset(preset["id"]).to_dict()
        assert preset["model"] == {k: v for k, v in architecture.items() if k != "vocab_size"}
    client.post(f"{JOBS}/{job['id']}/cancel", headers=tenant.headers)


def test_the_eta_counts_every_device(
    client: TestClient, tenant: Tenant, factory: Factory, session_factory: Any
) -> None:
    job_id = factory.job(tenant.owner_id, status="running", step=40, total_steps=100, tokens_per_s=4096.0)
    with session_factory() as s:
        s.get(Job, job_id).train_config = TrainConfig(devices=2).to_dict()
        s.commit()
    job = client.get(f"{JOBS}/{job_id}", headers=tenant.headers).json()
    # 2 devices x batch_size 16 x ctx 128 = 4096 tokens per step at 4096 tokens/s: 60 steps left = 60 s
    assert job["progress"]["eta_seconds"] == pytest.approx(60.0)


def test_broker_down_takes_the_create_back(settings: Any, tenant: Tenant, session_factory: Any) -> None:
    from api.main import create_app

    bad = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(bad)) as c:
        fid = upload(c, tenant, SHAKESPEARE.read_bytes(), "s.txt").json()["id"]
        err = assert_envelope(create(c, tenant, {"model": "llama-tiny", "training_file": fid}), 503)
        assert err["code"] == "broker_unavailable"
    assert count(session_factory, Job, Job.owner_id == tenant.owner_id) == 0
