"""The job page tells the whole run (issue 24 part 3), in a real Chromium against a stubbed API: its
configuration (every hyperparameter, the changed ones marked), files (names, sizes, tokens), model,
metadata, timings, device and precision, and the lifecycle events alone (GET /events?type=message).
The screenshot is saved as tests/artifacts/job_run_page.png (look at it)."""

from __future__ import annotations

from typing import Any

from api.hyperparams import resolve
from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.stub_api import StubApi, StubJobs, job_object, ok, sign_in_with_stub
from trainer.config import schema

JOB_ID = "ftjob-run"
EMPTY = {"object": "list", "data": [], "has_more": False}


def start_event() -> dict[str, Any]:
    """The worker's "Training on ..." event as worker.callbacks writes it (its data: StartInfo)."""
    info = {"total_steps": 40, "start_step": 0, "n_params": 1_234_567, "tokens_per_step": 4096,
            "device": "cuda:0", "dtype": "bfloat16", "processes": 1, "compile": True,
            "train_tokens": 90_123, "val_tokens": 9_876}  # fmt: skip
    return {"id": "ftevent-2", "object": "fine_tuning.job.event", "created_at": 1_700_000_061,
            "level": "info", "type": "message", "data": info,
            "message": "Training on cuda:0 in bfloat16: 1,234,567 parameters, 4,096 tokens per step"}  # fmt: skip


def message(n: int, text: str, at: int, level: str = "info") -> dict[str, Any]:
    return {"id": f"ftevent-{n}", "object": "fine_tuning.job.event", "created_at": at, "level": level,
            "type": "message", "data": {}, "message": text}  # fmt: skip


def run_job() -> dict[str, Any]:
    # as admission resolves a request (api.hyperparams): the configs and the hyperparameters shown
    resolved = resolve({"max_steps": 40, "learning_rate": 3e-4}, preset="llama-tiny", seed=1)
    job = job_object(
        JOB_ID, train=resolved.train_config.to_dict(), architecture=resolved.model_config.to_dict()
    )
    job.update(
        hyperparameters=resolved.hyperparameters,
        validation_file="file-2",
        metadata={"team": "nlp", "experiment": "lr-sweep"},
        started_at=1_700_000_060,
        finished_at=1_700_000_660,
        trained_tokens=600_000,
        queue="gpu",
    )
    return job


def open_run_page(new_page: Any, static_url: str) -> tuple[Any, Any, StubApi]:
    page, log = new_page()
    api = StubApi(page)
    StubJobs(api).add(run_job(), [])
    base = f"/fine_tuning/jobs/{JOB_ID}"
    api.on("GET", f"{base}/checkpoints", ok(EMPTY))
    events = [
        message(4, "The job has successfully completed", 1_700_000_660),
        message(3, "checkpoint_keep 2 is below the checkpoints stored", 1_700_000_300, level="warn"),
        start_event(),
        message(1, "Job started", 1_700_000_060),
    ]

    def answer_events(query: dict[str, str], _: Any) -> tuple[int, Any]:
        # the page asks for the lifecycle alone; anything else would bury it under per-step rows
        assert query.get("type") == "message", query
        return 200, {"object": "list", "data": events, "has_more": False}

    api.on("GET", f"{base}/events", answer_events)
    files = {
        "file-1": {"id": "file-1", "object": "file", "bytes": 100_000, "created_at": 1, "filename": "shakespeare.txt",
                   "purpose": "fine-tune", "format": "text", "sha256": "0" * 64},
        "file-2": {"id": "file-2", "object": "file", "bytes": 10_500, "created_at": 1, "filename": "val.txt",
                   "purpose": "fine-tune", "format": "text", "sha256": "1" * 64},
    }  # fmt: skip
    for fid, f in files.items():
        api.on("GET", f"/files/{fid}", ok(f))
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector("#config tbody tr[data-field]")
    page.wait_for_selector("#run-training-file:has-text('shakespeare.txt')")
    return page, log, api


def test_job_page_shows_config_files_model_metadata_timings(new_page: Any, static_url: str) -> None:
    page, log, api = open_run_page(new_page, static_url)
    properties = schema.json_schema()["properties"]
    shown = page.eval_on_selector_all("#config tbody tr", "rows => rows.map(r => r.dataset.field)")
    assert set(properties) <= set(shown)  # every hyperparameter the job takes
    changed = page.eval_on_selector_all("#config tbody tr.changed", "rows => rows.map(r => r.dataset.field)")
    assert set(changed) == {"max_steps", "learning_rate"}, changed
    assert page.inner_text("#config tr[data-field=learning_rate] td.value") == "0.0003"

    assert page.inner_text("#run-training-file").startswith("shakespeare.txt · 100.0 kB · 90,123 tokens")
    assert page.inner_text("#run-validation-file").startswith("val.txt · 10.5 kB · 9,876 tokens")
    assert page.inner_text("#run-parameters") == "1,234,567"
    assert page.inner_text("#run-size").startswith("4.9 MB")
    assert page.inner_text("#run-device") == "cuda:0 (queue gpu)"
    assert page.inner_text("#run-precision") == "bfloat16, compiled"
    assert page.inner_text("#run-duration") == "10m 00s"
    assert "(waited 1m 00s)" in page.inner_text("#run-queued")
    assert page.inner_text("#run-tokens-per-s") == "1,000 average"
    metadata = page.inner_text("#run-metadata")
    assert "team = nlp" in metadata and "experiment = lr-sweep" in metadata

    # the lifecycle events, newest first, and no per-step rows
    rows = page.locator("#events li.event span").all_inner_texts()
    assert rows[0] == "The job has successfully completed" and rows[-1] == "Job started"
    assert page.locator("#events li.level-warn").count() == 1
    assert api.calls[f"GET /fine_tuning/jobs/{JOB_ID}/events"] >= 1

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "job_run_page.png"), full_page=True)
    assert log.errors(allow=("404 (Not Found)",)) == [], log.messages
