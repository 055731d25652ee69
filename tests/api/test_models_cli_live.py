"""`fromscratch models show|complete|delete` and `files delete` as subprocesses against a live server
and a real inference worker (the tiny untrained checkpoint, a byte tokenizer, on a llama-tiny job row)."""

from __future__ import annotations

import json
from typing import Any

from tests.api.conftest import Factory
from tests.api.test_inference_service import owner_of, sdk_for
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - a fixture, used below
from tests.client.test_cli_live import cli, ok, upload
from tests.fixtures.service import LiveServer, ServiceProcess


def test_show_complete_and_delete_a_model(
    live_server: LiveServer,
    inference_worker: ServiceProcess,
    factory: Factory,
    session_factory: Any,
    tiny_checkpoint_tar: bytes,  # noqa: F811
) -> None:
    _, model_id = factory.finished_model(
        owner_of(live_server, session_factory), tar_bytes=tiny_checkpoint_tar
    )
    shown = json.loads(ok(cli(live_server, "models", "show", model_id, "--json")).stdout)
    assert shown["id"] == model_id and shown["max_model_len"] == 128  # the job's llama-tiny config
    table = ok(cli(live_server, "models", "show", model_id)).stdout
    assert "max_model_len" in table and "128" in table

    # streamed to stdout: the same text as the API's own answer to the same request
    sdk = sdk_for(live_server)
    for chat in (False, True):
        extra = ["--chat"] if chat else []
        done = ok(
            cli(
                live_server,
                "models",
                "complete",
                model_id,
                "Hello",
                "--max-tokens",
                "8",
                "--seed",
                "3",
                *extra,
            )
        )
        if chat:
            r = sdk.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, seed=3
            )
            want = r.choices[0].message.content
        else:
            want = (
                sdk.completions.create(model=model_id, prompt="Hello", max_tokens=8, seed=3).choices[0].text
            )
        assert done.stdout == f"{want}\n", (chat, done.stdout, want)
        assert "completion tokens, finish_reason" in done.stderr
    bad = cli(live_server, "models", "complete", model_id, "x", "--max-tokens", "100000")
    assert bad.returncode == 1 and "max_tokens" in bad.stderr

    ok(cli(live_server, "models", "delete", model_id))
    gone = cli(live_server, "models", "show", model_id)
    assert gone.returncode == 1 and "404" in gone.stderr, gone.stderr


def test_files_delete(live_server: LiveServer) -> None:
    file_id = upload(live_server)
    assert ok(cli(live_server, "files", "delete", file_id)).stdout.strip() == f"deleted {file_id}"
    listed = json.loads(ok(cli(live_server, "files", "list", "--json")).stdout)
    assert file_id not in [f["id"] for f in listed["data"]]
