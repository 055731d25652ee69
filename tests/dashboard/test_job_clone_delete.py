"""The job page's Clone and Delete model (views/job/model_actions.js), in a real Chromium against a
stubbed API: Clone opens the new-job form filled from the job (model, files, suffix, seed,
hyperparameters) and sends what the job was made with; Delete model (a second click confirms)
deletes the succeeded job's model (DELETE /v1/models/{id}), which then leaves the page's pickers; a
model deleted before the page opened is shown deleted, with nothing to delete."""

from __future__ import annotations

from typing import Any

from api.hyperparams import resolve
from tests.dashboard.stub_api import StubApi, StubJobs, error, job_object, ok, sign_in_with_stub, stub_file

JOB_ID = "ftjob-clone"
MODEL = "ft:llama-tiny:clone:final"
CHECKPOINT = "ft:llama-tiny:clone:ckpt-step-20"
EMPTY = {"object": "list", "data": [], "has_more": False}


def made_job() -> dict[str, Any]:
    """A succeeded job as admission makes one from a request with two hyperparameters."""
    resolved = resolve({"max_steps": 40, "learning_rate": 3e-4}, preset="llama-tiny", seed=7)
    job = job_object(JOB_ID, seed=7, suffix="sweep", train=resolved.train_config.to_dict(),
                     architecture=resolved.model_config.to_dict())  # fmt: skip
    job.update(hyperparameters=resolved.hyperparameters, validation_file="file-2", fine_tuned_model=MODEL)
    return job


def open_job(new_page: Any, static_url: str) -> tuple[Any, Any, StubApi]:
    page, log = new_page()
    api = StubApi(page)
    StubJobs(api).add(made_job(), [])
    base = f"/fine_tuning/jobs/{JOB_ID}"
    checkpoint = {"id": "ftckpt-1", "object": "fine_tuning.job.checkpoint", "created_at": 1_700_000_300,
                  "fine_tuned_model_checkpoint": CHECKPOINT, "fine_tuning_job_id": JOB_ID, "step_number": 20,
                  "metrics": {}, "is_final": False}  # fmt: skip
    api.on("GET", f"{base}/checkpoints", ok({"object": "list", "data": [checkpoint], "has_more": False}))
    api.on("GET", f"{base}/events", ok(EMPTY))
    files = [
        stub_file("file-2", "val.txt"),
        stub_file("file-1", "train.txt"),
        stub_file("file-3", "other.txt"),
    ]
    api.on("GET", "/files", ok({"object": "list", "data": files, "has_more": False}))
    return page, log, api


def picker_models(page: Any) -> list[str]:
    values: list[str] = page.eval_on_selector_all("#gen-model option", "os => os.map(o => o.value)")
    return values


def test_clone_fills_the_new_job_form_from_the_job(new_page: Any, static_url: str) -> None:
    page, log, api = open_job(new_page, static_url)
    api.on("POST", "/fine_tuning/jobs", error(400, "stopped here by the test"))
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.get_by_role("link", name="Clone").click()
    page.wait_for_selector("#clone-note")
    assert JOB_ID in page.inner_text("#clone-note")
    page.wait_for_selector("#training_file option[value='file-3']", state="attached")
    assert page.input_value("#training_file") == "file-1"
    assert page.input_value("#validation_file") == "file-2"
    assert page.input_value("#model") == "llama-tiny"
    assert page.input_value("#suffix") == "sweep"
    assert page.input_value("#hp-seed") == "7"
    assert page.input_value("#hp-max_steps") == "40"

    page.click("button:has-text('Start training')")
    page.wait_for_selector(".new-job .error-banner:has-text('stopped here')")
    sent = api.bodies("/fine_tuning/jobs")[-1]
    hyperparameters = made_job()["hyperparameters"]
    assert {k: sent[k] for k in ("model", "training_file", "validation_file", "suffix", "seed")} == {
        "model": "llama-tiny", "training_file": "file-1", "validation_file": "file-2", "suffix": "sweep", "seed": 7,
    }  # fmt: skip
    assert sent["hyperparameters"]["max_steps"] == 40 and sent["hyperparameters"]["learning_rate"] == 3e-4
    assert all(hyperparameters[k] == v for k, v in sent["hyperparameters"].items()), sent
    assert log.errors(allow=("400 (Bad Request)",)) == [], log.messages


def test_a_cloned_jobs_deleted_file_is_said(new_page: Any, static_url: str) -> None:
    page, log, api = open_job(new_page, static_url)
    api.on(
        "GET", "/files", ok({"object": "list", "data": [stub_file("file-2", "val.txt")], "has_more": False})
    )
    sign_in_with_stub(page, static_url, f"#/new?clone={JOB_ID}")
    page.wait_for_selector("#err-training_file:has-text('file-1')")
    assert "no longer among your files" in page.inner_text("#err-training_file")
    assert page.input_value("#training_file") == "" and page.input_value("#validation_file") == "file-2"
    assert log.errors() == [], log.messages


def test_delete_model_removes_it_from_the_pickers(new_page: Any, static_url: str) -> None:
    page, log, api = open_job(new_page, static_url)
    api.on("DELETE", f"/models/{MODEL}", ok({"id": MODEL, "object": "model", "deleted": True}))
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector("#btn-delete-model:visible")
    # the checkpoints arrive by a request of their own, maybe after the model's check
    page.wait_for_selector(f"#gen-model option[value='{CHECKPOINT}']", state="attached")
    assert picker_models(page) == [MODEL, CHECKPOINT]

    page.click("#btn-delete-model")
    assert page.inner_text("#btn-delete-model") == "Confirm delete"
    assert api.calls[f"DELETE /models/{MODEL}"] == 0  # one click deletes nothing
    page.click("#btn-delete-model")
    page.wait_for_selector("#model-deleted")
    page.wait_for_selector(f"#gen-model option[value='{MODEL}']", state="detached")
    assert api.calls[f"DELETE /models/{MODEL}"] == 1
    assert picker_models(page) == [CHECKPOINT]
    assert page.eval_on_selector_all("#dl-model option", "os => os.map(o => o.value)") == [CHECKPOINT]
    assert page.is_hidden("#btn-delete-model")
    assert log.errors() == [], log.messages


def test_a_model_deleted_before_is_shown_deleted(new_page: Any, static_url: str) -> None:
    page, log, api = open_job(new_page, static_url)
    api.on("GET", f"/models/{MODEL}", error(404, f"No model {MODEL}", "model"))
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector("#model-deleted")
    page.wait_for_selector(f"#gen-model option[value='{CHECKPOINT}']", state="attached")
    assert picker_models(page) == [CHECKPOINT]
    assert page.is_hidden("#btn-delete-model")
    assert page.is_visible("#btn-clone")
    assert log.errors(allow=("404 (Not Found)",)) == [], log.messages
