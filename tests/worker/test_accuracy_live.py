"""Token accuracy and loss masking through a real worker: a chat job (assistant turns trained only)
writes train_accuracy / val_accuracy Metric rows, checkpoint metrics with OpenAI's names (the final
one with full_valid_loss / full_valid_mean_token_accuracy, also recorded as an event), and the API
serves them in events, metric points, checkpoints and the results CSV."""

from __future__ import annotations

import csv
import io
import math
import secrets
from pathlib import Path

from fastapi.testclient import TestClient

from api.main import create_app
from core.keys import create_key
from tests.fixtures.service import make_job, wait_for_status
from tests.trainer.test_loss_mask import chat_records, write_jsonl
from tests.worker.helpers import checkpoint_rows, metric_rows

RUN = dict(
    max_steps=24,
    batch_size=4,
    eval_every=8,
    eval_batches=2,
    checkpoint_every=8,
    warmup_steps=2,
    log_every=1,
    val_fraction=0.2,
)


def test_chat_job_reports_accuracy_everywhere(
    service_settings, session_factory, worker_proc, tmp_path: Path
) -> None:
    owner = f"owner-{secrets.token_hex(6)}"
    with session_factory() as session:
        _, secret = create_key(session, "accuracy-test", owner_id=owner)
        session.commit()
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_records(300))
    job_id = make_job(service_settings, session_factory, owner_id=owner, data_path=chat, train=RUN)
    wait_for_status(session_factory, job_id, "succeeded", diagnostics=worker_proc.output)

    rows = metric_rows(session_factory, job_id)
    assert [m.step for m in rows] == list(range(1, 25))
    assert all(m.train_accuracy is not None and 0.0 <= m.train_accuracy <= 1.0 for m in rows)
    assert [m.step for m in rows if m.val_accuracy is not None] == [8, 16, 24]
    assert [m.step for m in rows if m.val_loss is not None] == [8, 16, 24]

    ckpts = checkpoint_rows(session_factory, job_id)
    final = ckpts[-1]
    assert final.is_final and final.step == 24
    by_step = {m.step: m for m in rows}
    for c in ckpts:
        assert c.metrics["train_mean_token_accuracy"] == by_step[c.step].train_accuracy
        assert c.metrics["valid_mean_token_accuracy"] == by_step[c.step].val_accuracy
        assert ("full_valid_loss" in c.metrics) == c.is_final
    full_loss, full_acc = final.metrics["full_valid_loss"], final.metrics["full_valid_mean_token_accuracy"]
    assert math.isfinite(full_loss) and 0.0 <= full_acc <= 1.0

    headers = {"Authorization": f"Bearer {secret}"}
    with TestClient(create_app(service_settings)) as client:
        events = client.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=headers).json()["data"]
        metric_events = {e["data"]["step"]: e["data"] for e in events if e["type"] == "metrics"}
        assert metric_events[24]["train_mean_token_accuracy"] == by_step[24].train_accuracy
        assert metric_events[24]["valid_mean_token_accuracy"] == by_step[24].val_accuracy
        assert metric_events[23]["valid_mean_token_accuracy"] is None
        full = [e for e in events if e["type"] == "message" and e["message"].startswith("Full validation")]
        assert len(full) == 1 and full[0]["data"] == {
            "step": 24,
            "full_valid_loss": full_loss,
            "full_valid_mean_token_accuracy": full_acc,
        }

        points = client.get(f"/v1/fine_tuning/jobs/{job_id}/metrics", headers=headers).json()["data"]
        assert [(p["train_accuracy"], p["val_accuracy"]) for p in points] == [
            (m.train_accuracy, m.val_accuracy) for m in rows
        ]

        served = client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=headers).json()["data"]
        newest = served[0]["metrics"]
        assert newest["full_valid_loss"] == full_loss and newest["full_valid_mean_token_accuracy"] == full_acc
        assert served[1]["metrics"]["full_valid_loss"] is None  # a step checkpoint: not measured

        job = client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=headers).json()
        text = client.get(f"/v1/files/{job['result_files'][0]}/content", headers=headers).text
    table = list(csv.DictReader(io.StringIO(text)))
    assert [float(r["train_accuracy"]) for r in table] == [m.train_accuracy for m in rows]
    assert [r["valid_mean_token_accuracy"] for r in table] == [
        "" if m.val_accuracy is None else repr(m.val_accuracy) for m in rows
    ]
