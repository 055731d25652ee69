"""What a user does right after a job finishes, with the official `openai` SDK only: upload, create
with metadata, follow the events to the end, read the result CSV, complete and chat with the model
(plain and streamed), list jobs by metadata, download GGUF (made by the training worker: 200 at
once) and ONNX (made on demand by an inference worker: 202, then 200). Then the API process must
have loaded no torch: compute runs in the workers.

The RSS of the API process before and after a burst of completions is printed (`-s` shows it);
it is a figure for the closing note, not an assertion."""

from __future__ import annotations

import csv
import io
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.service import SHAKESPEARE, LiveServer, ServiceProcess

STEPS = 12
DEADLINE_S = 600.0
CSV_HEADER = [
    "step",
    "train_loss",
    "train_accuracy",
    "valid_loss",
    "valid_mean_token_accuracy",
    "learning_rate",
    "tokens_per_s",
    "grad_norm",
    "tokens_seen",
    "peak_memory_bytes",
]


@pytest.fixture(scope="module")
def sdk(e2e_server: LiveServer, e2e_inference_worker: ServiceProcess) -> Iterator[openai.OpenAI]:
    # max_retries=0: a 5xx must fail the test, not be retried away
    client = openai.OpenAI(
        base_url=f"{e2e_server.url}/v1", api_key=e2e_server.api_key, max_retries=0, timeout=120.0
    )
    yield client
    client.close()


def mapped_libraries(pid: int) -> set[str]:
    """The shared objects a process has mapped (from /proc/<pid>/maps)."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and ".so" in parts[5]:
            names.add(Path(parts[5]).name)
    return names


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def follow_events(sdk: openai.OpenAI, job_id: str, logs: Any) -> list[Any]:
    """Read the job's events as they come (oldest first) until it ends; returns them all."""
    seen: dict[str, Any] = {}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        job = sdk.fine_tuning.jobs.retrieve(job_id)
        for event in sdk.fine_tuning.jobs.list_events(job_id, limit=100):
            seen.setdefault(event.id, event)
        if job.status in ("succeeded", "failed", "cancelled"):
            for event in sdk.fine_tuning.jobs.list_events(job_id, limit=100):
                seen.setdefault(event.id, event)
            assert job.status == "succeeded", f"{job.status}: {job.error}\n{logs()}"
            return sorted(seen.values(), key=lambda e: e.created_at)
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {job.status} after {DEADLINE_S:.0f}s\n{logs()}")
        time.sleep(0.5)


def download(sdk: openai.OpenAI, model: str, fmt: str) -> httpx.Response:
    """GET /v1/models/{model}/content?format=fmt through the SDK's own transport."""
    return sdk.get(f"/models/{model}/content", options={"params": {"format": fmt}}, cast_to=httpx.Response)


def test_after_training_with_the_sdk_only(
    sdk: openai.OpenAI, e2e_server: LiveServer, service_logs: Any, tmp_path: Path
) -> None:
    run = secrets.token_hex(4)
    with open(SHAKESPEARE, "rb") as fh:
        training_file = sdk.files.create(file=fh, purpose="fine-tune")
    job = sdk.fine_tuning.jobs.create(
        model="llama-tiny",
        training_file=training_file.id,
        seed=11,
        metadata={"suite": "after-training", "run": run},
        hyperparameters={
            "batch_size": 8,
            "ctx": 64,
            "max_steps": STEPS,  # type: ignore[typeddict-unknown-key]
            "eval_every": 6,
            "eval_batches": 2,
            "checkpoint_every": 0,
        },
    )
    other = sdk.fine_tuning.jobs.create(  # same owner, other metadata: the filter must leave it out
        model="llama-tiny",
        training_file=training_file.id,
        metadata={"suite": "after-training", "run": f"{run}-other"},
        hyperparameters={"max_steps": 1, "batch_size": 2, "ctx": 32},  # type: ignore[typeddict-unknown-key]
    )

    events = follow_events(sdk, job.id, service_logs)
    assert {e.level for e in events} <= {"info", "warn", "error"}
    metric_steps = [e.data["step"] for e in events if e.type == "metrics"]  # type: ignore[index]
    assert sorted(metric_steps) == list(range(1, STEPS + 1))
    done = sdk.fine_tuning.jobs.retrieve(job.id)
    model = done.fine_tuned_model
    assert model is not None

    # the result file: a CSV with a row per logged step
    assert len(done.result_files) == 1
    info = sdk.files.retrieve(done.result_files[0])
    assert info.purpose == "fine-tune-results"
    rows = list(csv.reader(io.StringIO(sdk.files.content(done.result_files[0]).text)))
    assert rows[0] == CSV_HEADER
    assert [int(r[0]) for r in rows[1:]] == list(range(1, STEPS + 1))
    assert all(float(r[1]) > 0 and float(r[5]) > 0 for r in rows[1:])  # train_loss, learning_rate
    assert [int(r[0]) for r in rows[1:] if r[3]] == [6, 12]  # valid_loss where it was evaluated

    # completions, plain and streamed (same seed: the same text)
    api_pid = e2e_server.process.pid
    rss_before = rss_mib(api_pid)
    plain = sdk.completions.create(model=model, prompt="ROMEO:", max_tokens=24, temperature=0.8, seed=5)
    text = plain.choices[0].text
    assert plain.usage is not None and plain.usage.prompt_tokens == len(b"ROMEO:")  # byte tokenizer
    assert 0 < plain.usage.completion_tokens <= 24
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    pieces = [
        c.choices[0].text
        for c in sdk.completions.create(
            model=model, prompt="ROMEO:", max_tokens=24, temperature=0.8, seed=5, stream=True
        )
        if c.choices
    ]
    assert len(pieces) > 1 and "".join(pieces) == text

    chat = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Speak, Juliet."}], max_tokens=20, seed=9
    )
    answer = chat.choices[0].message
    assert answer.role == "assistant" and answer.content is not None
    assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 20
    streamed = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Speak, Juliet."}],
        max_tokens=20,
        seed=9,
        stream=True,
    )
    deltas = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(deltas) == answer.content

    for i in range(20):  # a burst, for the RSS figure
        sdk.completions.create(model=model, prompt=f"{i}", max_tokens=32, seed=i)
    rss_after = rss_mib(api_pid)
    print(f"\nAPI process RSS: {rss_before:.1f} MiB before the completions, {rss_after:.1f} MiB after")

    # list by metadata
    listed = sdk.fine_tuning.jobs.list(metadata={"run": run})
    assert [j.id for j in listed.data] == [job.id]
    both = {j.id for j in sdk.fine_tuning.jobs.list(metadata={"suite": "after-training"}, limit=50)}
    assert {job.id, other.id} <= both

    # downloads: GGUF was made by the training worker; ONNX is made on demand by an inference worker
    gguf = download(sdk, model, "gguf")
    assert gguf.status_code == 200 and gguf.content[:4] == b"GGUF"
    first = download(sdk, model, "onnx")
    assert first.status_code == 202, first.text
    assert int(first.headers["retry-after"]) >= 1
    assert first.json()["status"] == "preparing"
    deadline = time.monotonic() + 300
    onnx = first
    while onnx.status_code == 202:
        assert time.monotonic() < deadline, f"onnx still preparing\n{service_logs()}"
        time.sleep(float(onnx.headers.get("retry-after", "1")))
        onnx = download(sdk, model, "onnx")
    assert onnx.status_code == 200, onnx.text
    (tmp_path / "model.onnx").write_bytes(onnx.content)
    import onnx as onnx_lib

    onnx_lib.checker.check_model(str(tmp_path / "model.onnx"))

    # after all of that, the API process holds no torch
    libraries = mapped_libraries(api_pid)
    assert not {name for name in libraries if "torch" in name}, sorted(libraries)
    if sdk.fine_tuning.jobs.retrieve(other.id).status not in ("succeeded", "failed", "cancelled"):
        sdk.fine_tuning.jobs.cancel(other.id)
