"""/v1/models: list/get/delete (ids with colons), the checkpoint download, generation (exports made
by workers: test_model_downloads.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Factory, Tenant
from tests.api.test_errors import assert_envelope
from trainer.config import PRESETS


def checkpoint_tar(parent: Path, **model: Any) -> bytes:
    """A real (untrained) trainer checkpoint folder as the worker stores it: a tar, folder at root;
    `model` changes the tiny architecture."""
    import torch

    from trainer.checkpoint import save_checkpoint
    from trainer.config import ModelConfig, TrainConfig
    from trainer.data.tokenizers import ByteTokenizer
    from trainer.model.llama import Llama

    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(n_layer=1, n_head=2, n_embd=16, ctx=32, vocab_size=258), **model})
    folder = save_checkpoint(
        parent / "step-00000050",
        model=Llama(cfg),
        model_config=cfg,
        train_config=TrainConfig(),
        tokenizer=ByteTokenizer(),
        state={"step": 50, "tokens_seen": 0, "best_val_loss": None, "sampler": {}, "total_steps": 50},
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(folder, arcname=folder.name)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiny_checkpoint_tar(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return checkpoint_tar(tmp_path_factory.mktemp("ckpt"))


def test_list_get_delete(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    job_id, model_id = factory.finished_model(tenant.owner_id, steps=(10, 20))
    running = factory.job(tenant.owner_id, status="running")
    factory.checkpoint(running, 5, f"ft:llama-tiny:{running.split('-', 1)[1]}:ckpt-step-5")
    listed = client.get("/v1/models", headers=tenant.headers).json()
    ids = {m["id"] for m in listed["data"] if m["kind"] != "base"}
    assert ids == {
        model_id,
        f"{model_id}:ckpt-step-10",
        f"{model_id}:ckpt-step-20",
        f"ft:llama-tiny:{running.split('-', 1)[1]}:ckpt-step-5",
    }
    final = next(m for m in listed["data"] if m["id"] == model_id)
    assert (
        final["object"] == "model" and final["owned_by"] == tenant.owner_id and final["kind"] == "fine_tuned"
    )
    assert final["job_id"] == job_id and final["step"] == 20 and final["root"] == "llama-tiny"
    assert final["max_model_len"] == PRESETS["llama-tiny"]["ctx"]  # what an evaluation's max_length needs

    ckpt = client.get(f"/v1/models/{model_id}:ckpt-step-10", headers=tenant.headers).json()
    assert ckpt["kind"] == "checkpoint" and ckpt["step"] == 10
    r = client.delete(f"/v1/models/{model_id}:ckpt-step-10", headers=tenant.headers)
    assert r.json() == {"id": f"{model_id}:ckpt-step-10", "object": "model", "deleted": True}
    assert_envelope(client.get(f"/v1/models/{model_id}:ckpt-step-10", headers=tenant.headers), 404)
    assert f"{model_id}:ckpt-step-10" not in {
        m["id"] for m in client.get("/v1/models", headers=tenant.headers).json()["data"]
    }
    steps = [
        c["step_number"]
        for c in client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=tenant.headers).json()[
            "data"
        ]
    ]
    assert steps == [20]
    assert client.delete(f"/v1/models/{model_id}", headers=tenant.headers).status_code == 200
    assert_envelope(client.get(f"/v1/models/{model_id}", headers=tenant.headers), 404)
    assert_envelope(
        client.get(f"/v1/models/{model_id}/content?format=checkpoint", headers=tenant.headers), 404
    )
    assert_envelope(client.get("/v1/models/ft:nope:abc", headers=tenant.headers), 404)


def test_checkpoint_download_is_the_stored_tar(
    client: TestClient, tenant: Tenant, factory: Factory, tiny_checkpoint_tar: bytes
) -> None:
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    r = client.get(f"/v1/models/{model_id}/content?format=checkpoint", headers=tenant.headers)
    assert r.status_code == 200
    assert r.content == tiny_checkpoint_tar
    assert r.headers["content-length"] == str(len(tiny_checkpoint_tar))
    assert ".tar" in r.headers["content-disposition"] and "attachment" in r.headers["content-disposition"]
    err = assert_envelope(
        client.get(f"/v1/models/{model_id}/content?format=zip", headers=tenant.headers), 400
    )
    assert err["param"] == "format"


def test_generate_refuses_bad_bodies_before_queueing(
    client: TestClient, tenant: Tenant, factory: Factory, tiny_checkpoint_tar: bytes
) -> None:
    """/generate runs in an inference worker (tests/api/test_inference_service.py); what it refuses
    is refused here, with no worker."""
    _, model_id = factory.finished_model(tenant.owner_id, tar_bytes=tiny_checkpoint_tar)
    url = f"/v1/models/{model_id}/generate"
    for body, param in (
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 2049}, "max_tokens"),  # past max_completion_tokens
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"prompt": "x", "temperature": 5}, "temperature"),  # /v1/completions' bound, 2
        ({"prompt": "x", "stream": True}, "stream"),  # unknown here: refused, not ignored
        ({"prompt": "x", "max_tokens": "3"}, "max_tokens"),  # strict, as /v1/completions
    ):
        assert assert_envelope(client.post(url, headers=tenant.headers, json=body), 400)["param"] == param


def test_presets_are_base_models_listed_and_retrieved_but_without_weights(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    """OpenAI lists the models one can fine-tune; here those are the presets: listed after the
    key's own models, retrievable, and a 400 naming `model` wherever weights are needed."""
    _, model_id = factory.finished_model(tenant.owner_id)
    listed = client.get("/v1/models", headers=tenant.headers).json()["data"]
    bases = [m for m in listed if m["kind"] == "base"]
    assert [m["id"] for m in bases] == list(PRESETS) and listed[-len(PRESETS) :] == bases
    assert model_id in [m["id"] for m in listed[: -len(PRESETS)]]  # the key's own models first
    tiny = client.get("/v1/models/llama-tiny", headers=tenant.headers).json()
    assert tiny == next(m for m in bases if m["id"] == "llama-tiny")
    assert tiny["job_id"] is None and tiny["formats"] == [] and tiny["owned_by"] == "fromscratch"
    assert [m["max_model_len"] for m in bases] == [p["ctx"] for p in PRESETS.values()]
    for method, path, body in (
        ("get", "/v1/models/llama-tiny/content?format=gguf", None),
        ("delete", "/v1/models/llama-tiny", None),
        ("post", "/v1/models/llama-tiny/generate", {"prompt": "x"}),
        ("post", "/v1/completions", {"model": "llama-tiny", "prompt": "x"}),
    ):
        r = client.request(method.upper(), path, headers=tenant.headers, json=body)
        err = assert_envelope(r, 400)
        assert (err["param"], err["code"]) == ("model", "base_model"), (path, err)
    assert client.get("/v1/models/llama-tiny", headers=tenant.headers).status_code == 200  # not deleted


def test_deleting_models_frees_their_weights_once_the_job_has_ended(
    client: TestClient, tenant: Tenant, factory: Factory
) -> None:
    """A job's model and its final checkpoint are the same weights: deleting the model deletes both,
    and the bytes of an ended job's deleted models leave the store (and the storage quota). A model
    that an unfinished job continues from is refused, naming the job."""
    from core.models import Blob
    from core.quotas import stored_bytes

    job_id, model_id = factory.finished_model(tenant.owner_id, steps=(10, 20))
    child = factory.job(tenant.owner_id, status="queued", base_model_id=model_id)

    def stored() -> tuple[int, int]:
        with factory.sf() as s:
            return stored_bytes(s, tenant.owner_id), s.query(Blob).count()

    def listed() -> set[str]:
        return {m["id"] for m in client.get("/v1/models", headers=tenant.headers).json()["data"]}

    before_bytes, before_blobs = stored()
    err = assert_envelope(client.delete(f"/v1/models/{model_id}", headers=tenant.headers), 400)
    assert err["code"] == "model_in_use" and child in err["message"]
    factory.set_status(child, "cancelled")

    # the final checkpoint alone: hidden, its bytes stay (the model is the same weights)
    assert client.delete(f"/v1/models/{model_id}:ckpt-step-20", headers=tenant.headers).status_code == 200
    assert stored() == (before_bytes, before_blobs) and model_id in listed()
    r = client.get(f"/v1/models/{model_id}/content?format=checkpoint", headers=tenant.headers)
    assert r.status_code == 200 and r.content  # still the step-20 weights
    assert client.delete(f"/v1/models/{model_id}", headers=tenant.headers).status_code == 200
    after_bytes, after_blobs = stored()
    assert after_blobs == before_blobs - 1 and after_bytes < before_bytes
    assert listed() & {model_id, f"{model_id}:ckpt-step-20"} == set()
    assert f"{model_id}:ckpt-step-10" in listed()  # not deleted: kept

    assert client.delete(f"/v1/models/{model_id}:ckpt-step-10", headers=tenant.headers).status_code == 200
    assert stored()[1] == before_blobs - 2
    checkpoints = client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=tenant.headers).json()
    assert checkpoints["data"] == []
