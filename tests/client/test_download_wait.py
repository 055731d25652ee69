"""`fromscratch models download` waits while a worker prepares an export (the server answers 202
with Retry-After), shows that it waits, then downloads; `--wait` bounds it. Against a fake transport
(the polling itself) and a live server with a real inference worker (the command end to end)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.http import APIError, Client
from tests.api.conftest import Factory
from tests.api.test_models import tiny_checkpoint_tar  # noqa: F401 - the fixture
from tests.client.test_cli_live import cli, ok


def preparing_then(file: bytes, times: int) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) <= times:
            body = {"object": "model.export", "id": "export-1", "status": "preparing", "message": "wait"}
            return httpx.Response(202, headers={"Retry-After": "1"}, json=body)
        return httpx.Response(
            200, headers={"Content-Disposition": 'attachment; filename="m.gguf"'}, content=file
        )

    return httpx.MockTransport(handler), seen


def test_download_asks_again_after_retry_after() -> None:
    transport, seen = preparing_then(b"GGUF-bytes", times=2)
    out = io.BytesIO()
    waits: list[float] = []
    started: list[Any] = []
    with Client("http://x", "fsk-test", transport=transport) as client:
        client.download_model(
            "ft:m",
            "gguf",
            out.write,
            on_start=lambda total, name: started.append((total, name)),
            dtype="f16",
            on_preparing=waits.append,
        )
    assert out.getvalue() == b"GGUF-bytes" and started == [(10, "m.gguf")]
    assert len(seen) == 3 and all(r.url.params["dtype"] == "f16" for r in seen)
    assert len(waits) == 2 and waits == sorted(waits)  # a tick a second: one per one-second wait


def test_download_gives_up_past_its_wait() -> None:
    transport, seen = preparing_then(b"x", times=100)
    with Client("http://x", "fsk-test", transport=transport) as client:
        with pytest.raises(APIError) as err:
            client.download_model("ft:m", "onnx", lambda chunk: None, wait=0.5)
    assert len(seen) == 1
    assert "still being prepared" in err.value.message and "--wait" in err.value.message


def test_cli_download_waits_for_the_inference_worker(
    live_server: Any,
    inference_worker: Any,
    settings: Any,
    session_factory: Any,
    tiny_checkpoint_tar: bytes,  # noqa: F811
    tmp_path: Path,
) -> None:
    from core.keys import verify_key

    with session_factory() as s:
        key = verify_key(s, live_server.api_key)
        assert key is not None
        owner = key.owner_id
    _, model_id = Factory(settings, session_factory).finished_model(owner, tar_bytes=tiny_checkpoint_tar)

    # an unknown model: the error alone, no empty progress bar before it
    missing = cli(live_server, "models", "download", "ft:llama-tiny:nope")
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        line for line in missing.stderr.strip().splitlines() if "bytes" not in line and "━" not in line
    ], missing.stderr
    assert "ft:llama-tiny:nope" in missing.stderr, missing.stderr

    # a limit shorter than one Retry-After: the first 202 is the answer, one error line, exit 1
    hurried = cli(live_server, "models", "download", model_id, "--format", "hf", "--wait", "0.5")
    assert hurried.returncode == 1
    last = hurried.stderr.strip().splitlines()[-1]
    assert "still being prepared" in last and "--wait" in last and "HTTP 202" in last, hurried.stderr

    out = tmp_path / "dl" / "model.onnx"
    done = ok(cli(live_server, "models", "download", model_id, "--format", "onnx", "-o", out))
    assert "preparing onnx" in done.stderr and "onnx export prepared after" in done.stderr, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(out)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids"]
    assert [p.name for p in out.parent.iterdir()] == ["model.onnx"]  # no temp file left behind

    f16 = ok(cli(live_server, "models", "download", model_id, "--dtype", "f16", "-o", tmp_path))
    saved = Path(f16.stdout.strip().splitlines()[-1])
    assert saved.name.endswith("-f16.gguf") and saved.read_bytes()[:4] == b"GGUF"
