"""What one job may ask for (issue 9's probes): out-of-schema numbers and jobs too large for the
service are 400s naming the field to change, and nothing is written. Unit tests of api.job_limits
cover the choice of that field; the route tests check the answer and that no job row appears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.job_limits import JobTooLarge, check_job_limits
from core.models import Job
from core.settings import Settings
from tests.api.conftest import SHAKESPEARE, Tenant, count, upload
from tests.api.test_errors import assert_envelope
from trainer.config import ModelConfig, TrainConfig, model_config_from_preset, schema

JOBS = "/v1/fine_tuning/jobs"
GiB = 1 << 30


@pytest.fixture
def file_id(client: TestClient, tenant: Tenant) -> str:
    r = upload(client, tenant, SHAKESPEARE.read_bytes(), "shakespeare.txt")
    assert r.status_code == 200, r.text
    return r.json()["id"]


def refused(
    client: TestClient, tenant: Tenant, file_id: str, session_factory: Any, hyperparameters: dict[str, Any]
) -> dict[str, Any]:
    """The error of a create with these hyperparameters, after checking that nothing was written."""
    body = {"model": "llama-tiny", "training_file": file_id, "hyperparameters": hyperparameters}
    err = assert_envelope(client.post(JOBS, headers=tenant.headers, json=body), 400)
    assert count(session_factory, Job, Job.owner_id == tenant.owner_id) == 0
    return err


# the probes of issue 9: each was accepted (200) before the schema had maximums
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_layer", 100_000),
        ("n_layer", 2**63),
        ("n_embd", 10**9),
        ("n_embd", 1e9),
        ("ffn_dim", 10**12),
        ("batch_size", 10**6),
        ("max_steps", 10**12),
        ("grad_accum", 10**9),
        ("eval_batches", 10**9),
    ],
)
def test_numbers_beyond_the_schema_are_400_naming_the_field(
    client: TestClient, tenant: Tenant, file_id: str, session_factory: Any, field: str, value: int
) -> None:
    err = refused(client, tenant, file_id, session_factory, {field: value})
    assert err["param"] == field, err
    # max_steps past the service's limit is refused by that limit, however far past (issue 24)
    assert err["code"] == ("job_too_large" if field == "max_steps" else "invalid_hyperparameter")


@pytest.mark.parametrize(
    ("hyperparameters", "param", "fragments"),
    [
        # 1.9 billion parameters: 28 GiB of weights, gradients and AdamW state alone
        ({"n_layer": 256, "n_embd": 768, "n_head": 12}, "n_embd", ["GiB", "16.0 GiB", "n_layer"]),
        ({"n_layer": 256, "n_head": 4, "n_kv_head": 4, "n_embd": 2048}, "n_embd", ["smaller model"]),
        # the model is tiny, the micro-batch is not
        ({"batch_size": 4096, "ctx": 1024}, "batch_size", ["batch_size <=", "activation_checkpointing=true"]),
        ({"max_steps": 2_000_000}, "max_steps", ["1,000,000 steps", "FROMSCRATCH_MAX_JOB_STEPS"]),
        ({"n_epochs": 10_000, "batch_size": 1}, "n_epochs", ["optimizer steps", "Lower n_epochs"]),
        ({"max_steps": 1_000_000, "batch_size": 256}, "max_steps", ["tokens", "FROMSCRATCH_MAX_JOB_TOKENS"]),
        # an evaluation of 10,000 batches after every step: the evaluations are what to lower
        (
            {"max_steps": 1_000_000, "eval_every": 1, "eval_batches": 10_000},
            "eval_batches",
            ["validation tokens", "FROMSCRATCH_MAX_JOB_TOKENS", "a larger eval_every"],
        ),
        ({"checkpoint_every": 1, "keep_checkpoints": 1000}, "keep_checkpoints", ["keep_checkpoints <= 20"]),
    ],
)
def test_jobs_too_large_for_the_service_are_400_job_too_large(
    client: TestClient,
    tenant: Tenant,
    file_id: str,
    session_factory: Any,
    hyperparameters: dict[str, Any],
    param: str,
    fragments: list[str],
) -> None:
    err = refused(client, tenant, file_id, session_factory, hyperparameters)
    assert (err["param"], err["code"]) == (param, "job_too_large"), err
    for fragment in fragments:
        assert fragment in err["message"], err


OPTIMIZERS = next(h for h in schema.fields() if h.name == "optimizer").choices or ()


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_model_too_large_is_400_with_every_optimizer_choice(
    client: TestClient, tenant: Tenant, file_id: str, session_factory: Any, optimizer: str
) -> None:
    """The refusal names the optimizer by its schema choice: a new choice needs no table here (a
    missing entry once made this a 500)."""
    hyperparameters = {"optimizer": optimizer, "n_layer": 256, "n_embd": 768, "n_head": 12}
    err = refused(client, tenant, file_id, session_factory, hyperparameters)
    assert (err["param"], err["code"]) == ("n_embd", "job_too_large"), err
    assert f"optimizer={optimizer}" in err["message"], err
    assert "FROMSCRATCH_CPU_WORKER_MEMORY_BYTES" in err["message"], err


def test_a_gpu_job_is_measured_against_the_gpu_worker(
    client: TestClient, tenant: Tenant, file_id: str
) -> None:
    # ~20 GiB in bf16 on a GPU: more than a 16 GiB CPU worker, less than an 80 GiB GPU
    body: dict[str, Any] = {
        "model": "llama-tiny",
        "training_file": file_id,
        "hyperparameters": {"batch_size": 2048, "ctx": 1024},
    }
    err = assert_envelope(client.post(JOBS, headers=tenant.headers, json=body), 400)
    assert err["param"] == "batch_size" and "cpu worker" in err["message"]
    body["hyperparameters"] = {**body["hyperparameters"], "device": "cuda"}
    ok = client.post(JOBS, headers=tenant.headers, json=body)
    assert ok.status_code == 200, ok.text


# ---------------------------------------------------------------- api.job_limits, unit


def check(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    tmp_path: Path,
    *,
    given: set[str] | None = None,
    continuing: bool = False,
    queue: str = "cpu",
    training_tokens: int = 10**6,
    **limits: Any,
) -> None:
    check_job_limits(
        model_cfg,
        train_cfg,
        queue=queue,
        training_tokens=training_tokens,
        has_validation_file=False,
        given=given or set(),
        continuing=continuing,
        settings=Settings(data_dir=tmp_path, **limits),
    )


def refusal(*args: Any, **kwargs: Any) -> JobTooLarge:
    with pytest.raises(JobTooLarge) as info:
        check(*args, **kwargs)
    return info.value


def test_the_presets_fit_with_their_defaults(tmp_path: Path) -> None:
    # 1 GB of text: dropout auto is 0 for each (trainer.config.data_aware)
    for preset in ("llama-tiny", "llama-260k", "llama-15m", "llama-42m"):
        check(
            model_config_from_preset(preset, vocab_size=4096), TrainConfig(), tmp_path, training_tokens=10**9
        )


def test_admission_plans_for_the_dropout_auto_will_choose_on_small_data(tmp_path: Path) -> None:
    model = model_config_from_preset("llama-42m", vocab_size=4096)
    # 1 MB for ~25M parameters: auto decides dropout 0.2, and on the CPU attention then keeps its
    # probabilities (ctx x ctx per head) for the backward pass
    err = refusal(model, TrainConfig(), tmp_path)
    assert "with dropout 0.2, which keeps attention's probabilities on the CPU" in err.message
    assert err.param == "batch_size" and ", dropout=0 (it then needs about " in err.message, err.message
    check(model, TrainConfig(dropout=0.0), tmp_path)  # the same job without dropout fits


def test_the_field_named_follows_what_is_too_large(tmp_path: Path) -> None:
    big = model_config_from_preset("llama-110m", vocab_size=258, n_layer=200)
    assert refusal(big, TrainConfig(), tmp_path, given={"n_layer"}).param == "n_layer"
    wide_ffn = model_config_from_preset("llama-15m", vocab_size=258, ffn_dim=131072, n_layer=12)
    assert refusal(wide_ffn, TrainConfig(), tmp_path, given={"ffn_dim"}).param == "ffn_dim"
    err = refusal(big, TrainConfig(), tmp_path, continuing=True)
    assert err.param == "model" and "smaller model" in err.message


def test_checkpointing_is_suggested_when_one_window_does_not_fit_without_it(tmp_path: Path) -> None:
    from trainer.config.estimate import estimate_memory, with_checkpointing

    model_cfg = model_config_from_preset("llama-42m", vocab_size=258, ctx=8192)
    train_cfg = TrainConfig(batch_size=4)
    plain = estimate_memory(model_cfg, train_cfg, "cpu", batch_size=1).total
    checkpointed = estimate_memory(model_cfg, with_checkpointing(train_cfg), "cpu", batch_size=1).total
    assert checkpointed < plain
    limit = (plain + checkpointed) // 2
    err = refusal(model_cfg, train_cfg, tmp_path, cpu_worker_memory_bytes=limit)
    assert err.param == "activation_checkpointing" and "activation_checkpointing=true" in err.message
    err = refusal(
        model_cfg, with_checkpointing(train_cfg), tmp_path, cpu_worker_memory_bytes=checkpointed - 1
    )
    assert err.param == "ctx"


def test_limits_come_from_settings(tmp_path: Path) -> None:
    tiny = model_config_from_preset("llama-tiny", vocab_size=258)
    check(
        tiny,
        TrainConfig(max_steps=50, keep_checkpoints=5),
        tmp_path,
        max_job_steps=50,
        max_checkpoints_per_job=5,
    )
    assert refusal(tiny, TrainConfig(max_steps=51), tmp_path, max_job_steps=50).param == "max_steps"
    assert refusal(tiny, TrainConfig(), tmp_path, max_job_steps=999).param == "max_steps"  # the default 1000
    err = refusal(tiny, TrainConfig(keep_checkpoints=6), tmp_path, max_checkpoints_per_job=5)
    assert err.param == "keep_checkpoints"
    # default steps x batch_size x ctx, and 20 evaluations (auto: every 50th step) x eval_batches 20
    # x batch_size x ctx on the held-out split
    tokens = 1000 * 16 * 128 + 20 * 20 * 16 * 128
    check(tiny, TrainConfig(), tmp_path, max_job_tokens=tokens)
    assert refusal(tiny, TrainConfig(), tmp_path, max_job_tokens=tokens - 1).param == "batch_size"
    two = TrainConfig(devices=2, eval_every=0)  # batch_size is per device: twice the training tokens
    check(tiny, two, tmp_path, max_job_tokens=2 * 1000 * 16 * 128, cpu_worker_devices=2)
    err = refusal(tiny, two, tmp_path, max_job_tokens=2 * 1000 * 16 * 128 - 1, cpu_worker_devices=2)
    assert err.param == "batch_size" and "x devices 2" in err.message
    err = refusal(tiny, TrainConfig(), tmp_path, cpu_worker_memory_bytes=GiB // 2)
    assert err.param == "n_embd" and "(512 MiB, FROMSCRATCH_CPU_WORKER_MEMORY_BYTES)" in err.message
    check(tiny, TrainConfig(device="cuda"), tmp_path, queue="gpu", cpu_worker_memory_bytes=GiB // 2)
