"""The playground end to end in headless Chromium: a live server, a training worker and an inference
worker. A tiny job is trained through the API; from its page "Try it in the playground" opens the
playground with its model; a streamed chat and a streamed completion show text, and it is the text
the API gives for the same request unstreamed (same seed). The screenshot is saved as
tests/artifacts/playground.png (look at it)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.dashboard.conftest import ARTIFACTS
from tests.fixtures.service import SHAKESPEARE, LiveServer, wait_until

STEPS = 12
SAMPLING = {"max_tokens": 24, "temperature": 0.8, "top_p": 1, "seed": 9}


def train_tiny_model(server: LiveServer) -> tuple[str, str]:
    """Upload the text, train llama-tiny for STEPS steps through the API; (job id, model id)."""
    with httpx.Client(base_url=f"{server.url}/v1", headers=server.headers(), timeout=60.0) as client:
        with open(SHAKESPEARE, "rb") as fh:
            upload = client.post(
                "/files", data={"purpose": "fine-tune"}, files={"file": (SHAKESPEARE.name, fh)}
            )
        assert upload.status_code == 200, upload.text
        hyperparameters = {"batch_size": 8, "ctx": 64, "max_steps": STEPS, "eval_every": 6, "eval_batches": 2}
        created = client.post(
            "/fine_tuning/jobs",
            json={"model": "llama-tiny", "training_file": upload.json()["id"], "seed": 3,
                  "hyperparameters": hyperparameters},
        )  # fmt: skip
        assert created.status_code == 200, created.text
        job_id = created.json()["id"]

        def finished() -> dict[str, Any] | None:
            job: dict[str, Any] = client.get(f"/fine_tuning/jobs/{job_id}").json()
            assert job["status"] not in ("failed", "cancelled"), job
            return job if job["status"] == "succeeded" else None

        job = wait_until(finished, timeout=300, interval=0.5, message=f"job {job_id} to succeed")
        assert job is not None
        return job_id, job["fine_tuned_model"]


def unstreamed(server: LiveServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{server.url}/v1{path}", json=body, headers=server.headers(), timeout=120.0)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_playground_streams_from_a_trained_model(
    new_page: Any, live_server: LiveServer, worker_proc: Any, inference_worker: Any
) -> None:
    job_id, model = train_tiny_model(live_server)
    page, log = new_page()
    page.goto(live_server.url + "/")
    page.fill("#api-key", live_server.api_key)
    page.keyboard.press("Enter")
    page.wait_for_selector("h1:has-text('Training jobs')")

    # from the job page, with its final model chosen
    page.goto(f"{live_server.url}/#/jobs/{job_id}")
    page.wait_for_selector(f"#gen-model option[value='{model}']", state="attached")
    page.get_by_role("link", name="Try it in the playground").click()
    page.wait_for_selector("#pg-model:enabled")
    assert page.get_by_label("Model or checkpoint").input_value() == model
    # trained on plain text: the playground starts in completion mode
    page.wait_for_selector(f".pg-main[data-mode-for='{model}']")
    assert page.get_by_role("radio", name="Completion").is_checked()

    # a streamed chat
    page.get_by_role("radio", name="Chat").check()
    page.get_by_label("Max tokens").fill(str(SAMPLING["max_tokens"]))
    page.get_by_label("Seed").fill(str(SAMPLING["seed"]))
    page.get_by_label("Your message").fill("Speak, Juliet.")
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector("#pg-stats[data-completion-tokens]", timeout=120_000)
    answer = page.locator(".msg-assistant .msg-text").inner_text()
    chunks = int(page.get_attribute("#pg-stats", "data-chunks") or 0)
    tokens = int(page.get_attribute("#pg-stats", "data-completion-tokens") or 0)
    assert answer.strip(), "the assistant's answer is empty"
    assert chunks > 1, f"the answer came in {chunks} piece(s), not streamed"
    assert 0 < tokens <= SAMPLING["max_tokens"]
    assert page.locator(".msg-assistant[data-outcome]").count() == 0  # neither stopped nor cut short
    plain = unstreamed(
        live_server,
        "/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "Speak, Juliet."}], **SAMPLING},
    )
    assert answer == plain["choices"][0]["message"]["content"]
    assert tokens == plain["usage"]["completion_tokens"]

    # a streamed completion
    page.get_by_role("radio", name="Completion").check()
    page.get_by_label("Prompt", exact=True).fill("ROMEO:")
    page.get_by_role("button", name="Generate").click()
    page.wait_for_selector("#pg-stats[data-completion-tokens]", timeout=120_000)
    shown = page.locator("#pg-output .generated").inner_text()
    plain = unstreamed(live_server, "/completions", {"model": model, "prompt": "ROMEO:", **SAMPLING})
    assert shown and shown == plain["choices"][0]["text"]
    assert page.locator("#pg-output .prompt-echo").inner_text() == "ROMEO:"

    page.get_by_role("radio", name="Chat").check()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
    assert log.errors() == [], log.messages
