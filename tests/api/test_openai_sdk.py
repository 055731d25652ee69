"""The official openai SDK parses our responses (through the TestClient's transport; the live
server end-to-end version lives with the service tests)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import SHAKESPEARE, Factory, Tenant


def test_sdk_files_jobs_events_checkpoints(client: TestClient, tenant: Tenant, factory: Factory) -> None:
    import openai

    sdk = openai.OpenAI(
        base_url="http://testserver/v1", api_key=tenant.secret, http_client=client, max_retries=0
    )
    f = sdk.files.create(file=("s.txt", SHAKESPEARE.read_bytes()), purpose="fine-tune")
    assert f.id.startswith("file-") and f.bytes == SHAKESPEARE.stat().st_size
    job = sdk.fine_tuning.jobs.create(
        model="llama-tiny", training_file=f.id, seed=1, hyperparameters={"n_epochs": 1, "batch_size": 4}
    )
    assert job.status == "queued" and job.hyperparameters.batch_size == 4
    assert sdk.fine_tuning.jobs.retrieve(job.id).id == job.id
    assert job.id in [j.id for j in sdk.fine_tuning.jobs.list(limit=5)]
    events = sdk.fine_tuning.jobs.list_events(job.id, limit=10)
    assert any("Created" in e.message for e in events)
    assert sdk.fine_tuning.jobs.cancel(job.id).status == "cancelled"

    done_job, model_id = factory.finished_model(tenant.owner_id, steps=(10, 20))
    ckpts = list(sdk.fine_tuning.jobs.checkpoints.list(done_job))
    assert [c.step_number for c in ckpts] == [20, 10]
    assert ckpts[0].fine_tuned_model_checkpoint == f"{model_id}:ckpt-step-20"
    assert sdk.models.retrieve(model_id).id == model_id
    assert model_id in [m.id for m in sdk.models.list()]

    try:
        sdk.fine_tuning.jobs.create(model="llama-tiny", training_file=f.id, hyperparameters={"n_epochs": -2})
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == "n_epochs"
    else:
        raise AssertionError("expected a 400")
    try:
        sdk.fine_tuning.jobs.retrieve("ftjob-missing")
    except openai.NotFoundError as e:
        assert e.status_code == 404
    else:
        raise AssertionError("expected a 404")
