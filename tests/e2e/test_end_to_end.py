"""End to end over HTTP against a live server and a real worker process (real PostgreSQL, real
Redis): upload a corpus, train a `llama-tiny` job of 50 steps, follow its Server-Sent Events to
`succeeded`, read the metrics and checkpoints, and check the downloads in their real consumers
(llama.cpp for GGUF, transformers for the Hugging Face archive, the trainer for the checkpoint).

One job is trained for the whole module (`trained` fixture); each test checks one aspect of it.
"""

from __future__ import annotations

import json
import math
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from core.archives import extract_all
from tests.fixtures.service import SHAKESPEARE, LiveServer, ServiceProcess

TERMINAL = ("succeeded", "failed", "cancelled")
STEPS, BATCH, CTX, EVAL_EVERY, CKPT_EVERY = 50, 8, 64, 10, 10
HYPERPARAMETERS = {
    "max_steps": STEPS,
    "batch_size": BATCH,
    "ctx": CTX,
    "eval_every": EVAL_EVERY,
    "eval_batches": 4,
    "checkpoint_every": CKPT_EVERY,
    "keep_checkpoints": 10,
    "learning_rate": 3e-3,
    "warmup_steps": 5,
}
JOB_DEADLINE_S = 600.0  # generous: two shared cores, a worker that first imports torch
PROMPT = "ROMEO:\n"
N_NEW = 40  # prompt + new tokens stay inside ctx, so no context shifting on either side


# ----------------------------------------------------------------------------------- SSE client
@dataclass
class SSEEvent:
    event: str
    id: str | None
    data: Any


@dataclass
class SSEStream:
    events: list[SSEEvent] = field(default_factory=list)
    retry_ms: int | None = None
    comments: int = 0


def read_sse(
    server: LiveServer,
    job_id: str,
    last_event_id: str | None = None,
    deadline_s: float = JOB_DEADLINE_S,
    params: dict[str, str] | None = None,
) -> SSEStream:
    """Read /stream until the server ends it (it must, after the terminal status event). Parsed
    as the SSE spec says: fields per line, an event dispatched at a blank line, `:` comments."""
    headers = server.headers()
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    out = SSEStream()
    deadline = time.monotonic() + deadline_s
    # read timeout well above the server's 15 s keep-alive: a silent stream is a failure
    timeout = httpx.Timeout(connect=10.0, read=90.0, write=10.0, pool=10.0)
    with httpx.stream(
        "GET",
        f"{server.url}/v1/fine_tuning/jobs/{job_id}/stream",
        headers=headers,
        params=params,
        timeout=timeout,
    ) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, list[str]] = {}
        for line in resp.iter_lines():
            if time.monotonic() > deadline:
                pytest.fail(
                    f"job {job_id} still streaming after {deadline_s:.0f}s; got "
                    f"{[(e.event, e.id) for e in out.events][-5:]}"
                )
            if line == "":
                if "data" in fields:
                    data = "\n".join(fields["data"])
                    out.events.append(
                        SSEEvent(
                            event=(fields.get("event") or ["message"])[-1],
                            id=(fields.get("id") or [None])[-1],
                            data=json.loads(data),
                        )
                    )
                fields = {}
                continue
            if line.startswith(":"):
                out.comments += 1
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "retry":
                out.retry_ms = int(value)
            else:
                fields.setdefault(name, []).append(value)
    return out


def cursor(event_id: str) -> tuple[int, int]:
    step, seq = event_id.split(".")
    return int(step), int(seq)


# ----------------------------------------------------------------------------------- fixtures
@dataclass
class Trained:
    server: LiveServer
    file_id: str
    job_id: str
    created: dict[str, Any]
    stream: SSEStream
    job: dict[str, Any]
    client: httpx.Client


@pytest.fixture(scope="module")
def trained(e2e_server: LiveServer, service_logs: Any) -> Iterator[Trained]:
    server = e2e_server
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=120.0) as client:
        with open(SHAKESPEARE, "rb") as fh:
            r = client.post(
                "/v1/files",
                data={"purpose": "fine-tune"},
                files={"file": (SHAKESPEARE.name, fh, "text/plain")},
            )
        assert r.status_code == 200, r.text
        file_obj = r.json()
        assert file_obj["bytes"] == SHAKESPEARE.stat().st_size

        r = client.post(
            "/v1/fine_tuning/jobs",
            json={
                "model": "llama-tiny",
                "training_file": file_obj["id"],
                "seed": 1234,
                "suffix": "e2e",
                "hyperparameters": HYPERPARAMETERS,
            },
        )
        assert r.status_code == 200, r.text
        created = r.json()

        try:
            stream = read_sse(server, created["id"])
        except (httpx.HTTPError, AssertionError) as e:
            pytest.fail(f"SSE stream failed: {e!r}\n{service_logs()}")
        r = client.get(f"/v1/fine_tuning/jobs/{created['id']}")
        assert r.status_code == 200, r.text
        job = r.json()
        if job["status"] != "succeeded":
            pytest.fail(f"job ended {job['status']}: {job.get('error')}\n{service_logs()}")
        yield Trained(server, file_obj["id"], created["id"], created, stream, job, client)


def _download(client: httpx.Client, model_id: str, fmt: str, dest: Path) -> Path:
    with client.stream("GET", f"/v1/models/{model_id}/content", params={"format": fmt}, timeout=300.0) as r:
        assert r.status_code == 200, r.read()
        expected = int(r.headers["content-length"])
        assert "attachment" in r.headers["content-disposition"]
        with open(dest, "wb") as fh:
            for chunk in r.iter_bytes():
                fh.write(chunk)
    assert dest.stat().st_size == expected
    return dest


def _extract(tar_path: Path, dest: Path, marker: str) -> Path:
    """Extract a tar and return the folder that holds `marker`."""
    with tarfile.open(tar_path) as tf:
        extract_all(tf, dest)
    found = sorted(dest.rglob(marker))
    assert found, f"no {marker} in {tar_path.name}: {[p.name for p in dest.rglob('*')]}"
    return found[0].parent


@pytest.fixture(scope="module")
def checkpoint_model(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The final model as the trainer loads it from the downloaded `format=checkpoint` tar."""
    from trainer.checkpoint import load_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpt")
    tar = _download(trained.client, trained.job["fine_tuned_model"], "checkpoint", root / "model.tar")
    return load_model(_extract(tar, root / "x", "model.safetensors"))


# ----------------------------------------------------------------------------------- tests
def test_job_created_then_succeeded(trained: Trained) -> None:
    created, job = trained.created, trained.job
    assert created["object"] == "fine_tuning.job" and created["id"].startswith("ftjob-")
    assert created["status"] in ("validating_files", "queued")
    assert created["training_file"] == trained.file_id
    assert job["status"] == "succeeded" and job["error"] is None
    assert job["fine_tuned_model"].startswith("ft:llama-tiny:e2e:")
    assert job["trained_tokens"] == STEPS * BATCH * CTX
    assert job["progress"]["step"] == job["progress"]["total_steps"] == STEPS
    assert job["finished_at"] >= job["created_at"]


def test_stream_follows_the_job_to_succeeded(trained: Trained) -> None:
    events = trained.stream.events
    assert trained.stream.retry_ms is not None  # EventSource reconnect hint
    statuses = [e.data["status"] for e in events if e.event == "status"]
    assert statuses[-1] == "succeeded" and events[-1].event == "status", [
        (e.event, e.id) for e in events[-3:]
    ]
    assert statuses.count("succeeded") == 1
    assert "running" in statuses and statuses.index("running") < statuses.index("succeeded")
    assert events[-1].data["job"]["fine_tuned_model"] == trained.job["fine_tuned_model"]
    # every event carries an id, and ids never go backwards
    ids = [cursor(e.id) for e in events if e.id is not None]
    assert len(ids) == len(events)
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(ids, ids[1:], strict=False))
    # the stream started from the beginning: every step, once, in order
    steps = [e.data["step"] for e in events if e.event == "metrics"]
    assert steps == list(range(steps[0], STEPS + 1)) and steps[0] <= 1
    assert all(cursor(e.id)[0] == e.data["step"] for e in events if e.event == "metrics")


def test_metrics_series(trained: Trained) -> None:
    r = trained.client.get(f"/v1/fine_tuning/jobs/{trained.job_id}/metrics")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["has_more"] is False
    points = body["data"]
    steps = [p["step"] for p in points]
    assert len(steps) == len(set(steps)) and steps == sorted(steps)
    assert steps[-1] == STEPS == body["total_steps"]
    assert all(math.isfinite(p["train_loss"]) for p in points)
    vals = [(p["step"], p["val_loss"]) for p in points if p["val_loss"] is not None]
    assert [s for s, _ in vals if s % EVAL_EVERY == 0] == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
    assert all(math.isfinite(v) for _, v in vals)
    # it learned: byte-level loss starts near ln(258) = 5.55
    assert points[-1]["train_loss"] < points[0]["train_loss"] - 0.5
    # the SSE metrics are the same rows
    sse = {e.data["step"]: e.data for e in trained.stream.events if e.event == "metrics"}
    assert sorted(sse) == steps
    assert all(sse[p["step"]]["train_loss"] == p["train_loss"] for p in points)

    # cursor paging in step order
    r = trained.client.get(
        f"/v1/fine_tuning/jobs/{trained.job_id}/metrics", params={"after_step": 20, "limit": 5}
    )
    page = r.json()
    assert [p["step"] for p in page["data"]] == [s for s in steps if s > 20][:5] and page["has_more"] is True

    # downsampled: at most 10 real points, increasing, ending with the last step
    r = trained.client.get(f"/v1/fine_tuning/jobs/{trained.job_id}/metrics", params={"max_points": 10})
    assert r.status_code == 200, r.text
    down = r.json()["data"]
    down_steps = [p["step"] for p in down]
    assert 2 <= len(down) <= 10
    assert down_steps == sorted(set(down_steps)) and set(down_steps) <= set(steps)
    assert down[-1] == points[-1]


def test_checkpoints_listed(trained: Trained) -> None:
    r = trained.client.get(f"/v1/fine_tuning/jobs/{trained.job_id}/checkpoints", params={"limit": 100})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    model = trained.job["fine_tuned_model"]
    assert [c["step_number"] for c in data] == list(range(STEPS, 0, -CKPT_EVERY))  # newest first
    for c in data:
        assert c["object"] == "fine_tuning.job.checkpoint" and c["fine_tuning_job_id"] == trained.job_id
        assert c["fine_tuned_model_checkpoint"] == f"{model}:ckpt-step-{c['step_number']}"
        assert math.isfinite(c["metrics"]["train_loss"])
    assert [c["step_number"] for c in data if c["is_final"]] == [STEPS]
    # a checkpoint is a model too
    mid = data[2]["fine_tuned_model_checkpoint"]
    r = trained.client.get(f"/v1/models/{mid}")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == mid
    r = trained.client.get("/v1/models")
    assert model in [m["id"] for m in r.json()["data"]]


def test_gguf_greedy_decodes_like_the_service_and_the_trainer(
    trained: Trained,
    checkpoint_model: tuple[Any, Any],
    tmp_path: Path,
    e2e_inference_worker: ServiceProcess,  # the service's sampler runs there
) -> None:
    import llama_cpp

    from trainer.sampling import generate_ids

    model, tok = checkpoint_model
    model_id = trained.job["fine_tuned_model"]
    prompt_ids = tok.encode(PROMPT)
    ours = generate_ids(model, prompt_ids, max_new_tokens=N_NEW, temperature=0)
    assert len(ours) == N_NEW and len(set(ours)) > 3, f"degenerate greedy output {tok.decode(ours)!r}"

    # the service's own sampler, greedy
    r = trained.client.post(
        f"/v1/models/{model_id}/generate", json={"prompt": PROMPT, "max_tokens": N_NEW, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    assert r.json()["text"] == tok.decode(ours)

    # llama.cpp on the downloaded GGUF (f32 KV cache: the default f16 cache moves logits by ~1e-2)
    path = _download(trained.client, model_id, "gguf", tmp_path / "model.gguf")
    llm = llama_cpp.Llama(
        str(path), n_ctx=256, type_k=0, type_v=0, verbose=False, logits_all=True, n_threads=1
    )
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=False) == prompt_ids
    llm.eval(prompt_ids)
    theirs: list[int] = []
    margins: list[float] = []
    for _ in range(N_NEW):
        logits = np.array(llm.scores[llm.n_tokens - 1])
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        theirs.append(int(np.argmax(logits)))
        llm.eval([theirs[-1]])
    assert theirs == ours, (
        f"llama.cpp {tok.decode(theirs)!r} vs trainer {tok.decode(ours)!r}; "
        f"smallest top-2 logit margin {min(margins):.2e}"
    )
    # and the logits themselves along the decoded sequence
    with torch.no_grad():
        expected = model(torch.tensor([prompt_ids + ours]))[0][0].numpy()
    rows = np.array(llm.scores[len(prompt_ids) - 1 : len(prompt_ids) - 1 + N_NEW])
    diff = np.abs(rows - expected[len(prompt_ids) - 1 : len(prompt_ids) - 1 + N_NEW]).max()
    assert diff < 1e-3, f"llama.cpp logits differ from the trainer's by {diff}"


def test_hf_archive_loads_in_transformers_with_the_checkpoint_logits(
    trained: Trained, checkpoint_model: tuple[Any, Any], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = checkpoint_model
    tar = _download(trained.client, trained.job["fine_tuned_model"], "hf", tmp_path / "hf.tar")
    folder = _extract(tar, tmp_path / "hf", "config.json")
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(folder)

    text = SHAKESPEARE.read_text(encoding="utf-8")[:CTX]
    ids = tok.encode(text)[:CTX]
    assert hf_tok(text, add_special_tokens=False)["input_ids"][:CTX] == ids
    with torch.no_grad():
        expected = model(torch.tensor([ids]))[0]
        got = hf_model(torch.tensor([ids])).logits
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff < 1e-4, f"HF logits differ from the checkpoint's by {diff}"


def test_stream_resumes_after_last_event_id(trained: Trained) -> None:
    events = trained.stream.events
    metric_events = [e for e in events if e.event == "metrics"]
    middle = metric_events[len(metric_events) // 2]
    assert middle.id is not None
    s, q = cursor(middle.id)

    resumed = read_sse(trained.server, trained.job_id, last_event_id=middle.id, deadline_s=120).events
    assert resumed, "a resumed stream of a finished job sends the rest and the terminal status"
    steps = [e.data["step"] for e in resumed if e.event == "metrics"]
    assert steps == [e.data["step"] for e in metric_events if e.data["step"] > s]
    for e in resumed:
        assert e.id is not None
        es, eq = cursor(e.id)
        assert es >= s and eq >= q
        if e.event != "metrics":
            assert eq > q, f"lifecycle event {e.event} {e.data} was sent before the cursor {middle.id}"
    # lifecycle rows after the cursor are exactly those the first stream sent after it
    later = [
        (e.event, cursor(e.id)[1])
        for e in events
        if e.event != "metrics" and e.id is not None and cursor(e.id)[1] > q
    ]
    assert [(e.event, cursor(e.id)[1]) for e in resumed if e.event != "metrics"] == later
    assert resumed[-1].event == "status" and resumed[-1].data["status"] == "succeeded"

    # the same through the query parameter (for clients that cannot set headers)
    by_query = read_sse(trained.server, trained.job_id, params={"last_event_id": middle.id}, deadline_s=120)
    assert [(e.event, e.id) for e in by_query.events] == [(e.event, e.id) for e in resumed]

    # everything already seen: the stream ends at once with nothing in it
    done = read_sse(trained.server, trained.job_id, last_event_id=events[-1].id, deadline_s=60)
    assert done.events == []
