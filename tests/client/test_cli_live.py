"""The `fromscratch files|jobs|models` client commands as subprocesses against a live server (real
uvicorn, real Postgres/Redis, a real `fromscratch worker`)."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import httpx

from tests.fixtures.service import REPO_ROOT, SHAKESPEARE, fromscratch_cmd, wait_until


def cli(
    server: Any, *args: str, api_key: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {
        **server.env,
        "FROMSCRATCH_SERVER": server.url,
        "FROMSCRATCH_API_KEY": api_key or server.api_key,
        "COLUMNS": "120",
    }
    return subprocess.run(
        fromscratch_cmd(*[str(a) for a in args]),
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result


def upload(server: Any) -> str:
    file_id = ok(cli(server, "files", "upload", SHAKESPEARE)).stdout.strip().splitlines()[-1]
    assert file_id.startswith("file-")
    return file_id


def test_upload_create_follow_show_download(live_server: Any, worker_proc: Any, tmp_path: Path) -> None:
    file_id = upload(live_server)
    listed = json.loads(ok(cli(live_server, "files", "list", "--json")).stdout)
    [mine] = [f for f in listed["data"] if f["id"] == file_id]
    assert mine["bytes"] == SHAKESPEARE.stat().st_size

    created = ok(
        cli(
            live_server,
            "jobs",
            "create",
            "--file",
            file_id,
            "--model",
            "llama-tiny",
            "--max-steps",
            40,
            "--eval-every",
            10,
            "--checkpoint-every",
            20,
            "--batch-size",
            8,
            "--learning-rate",
            "0.002",
        )
    )
    job_id = created.stdout.strip().splitlines()[-1]
    assert job_id.startswith("ftjob-")

    followed = cli(live_server, "jobs", "follow", job_id)
    ok(followed)
    assert "succeeded" in followed.stdout  # the summary table
    assert "last train loss" in followed.stdout and "40/40" in followed.stdout

    job = json.loads(ok(cli(live_server, "jobs", "show", job_id, "--json")).stdout)
    assert job["status"] == "succeeded"
    hp = job["hyperparameters"]
    assert hp["max_steps"] == 40 and hp["batch_size"] == 8 and hp["learning_rate"] == 0.002
    assert "n_embd" not in hp  # options not given were not sent
    assert job["progress"]["step"] == 40
    model_id = job["fine_tuned_model"]
    # the model's step (the best evaluation's when the run went past it) beside the last step's losses
    shown = dict(
        line.split("\t") for line in ok(cli(live_server, "jobs", "show", job_id)).stdout.splitlines()
    )
    listed = httpx.get(
        f"{live_server.url}/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=live_server.headers()
    )
    (final,) = [c for c in listed.json()["data"] if c["is_final"]]
    assert shown["model step"].startswith(f"{final['step_number']} (train loss ")

    human = ok(cli(live_server, "jobs", "list")).stdout
    assert job_id in human and "succeeded" in human
    # a page of one: the hint for the next page keeps its size (the extra 1-step job just trains)
    tagged = ("--suffix", "s1", "--metadata", "sweep=a")
    extra = ok(
        cli(live_server, "jobs", "create", "--file", file_id, "--max-steps", "1", *tagged)
    ).stdout.split()[-1]
    paged = ok(cli(live_server, "jobs", "list", "--limit", "1"))
    assert f"more: fromscratch jobs list --after {extra} --limit 1" in paged.stderr, paged.stderr
    # filtered by metadata and by status; the suffix is a column
    sweep = ok(cli(live_server, "jobs", "list", "--metadata", "sweep=a")).stdout.splitlines()
    assert [line.split("\t")[0] for line in sweep[1:]] == [extra] and sweep[1].split("\t")[3] == "s1"
    done = ok(cli(live_server, "jobs", "list", "--status", "succeeded")).stdout
    assert job_id in done and all("\tsucceeded\t" in line for line in done.splitlines()[1:])
    models = json.loads(ok(cli(live_server, "models", "list", "--json")).stdout)
    assert model_id in [m["id"] for m in models["data"]]

    out = tmp_path / "dl" / "model.gguf"
    ok(cli(live_server, "models", "download", model_id, "--format", "gguf", "-o", out))
    assert out.read_bytes()[:4] == b"GGUF"
    assert [p.name for p in out.parent.iterdir()] == ["model.gguf"]  # no temp file left behind

    # a folder format: unpacked, into its own folder inside an -o folder, or as -o itself
    def saved(*args: Any) -> Path:
        return Path(
            ok(cli(live_server, "models", "download", model_id, *args)).stdout.strip().splitlines()[-1]
        )

    folder = tmp_path / "into"
    folder.mkdir()
    inside = saved("--format", "checkpoint", "-o", folder)
    assert inside.parent == folder and (inside / "model.safetensors").is_file()
    assert [p.name for p in folder.iterdir()] == [inside.name]  # the tar is gone, nothing half done
    named = saved("--format", "checkpoint", "-o", tmp_path / "named" / "ckpt")
    assert named == tmp_path / "named" / "ckpt" and (named / "config.json").is_file()
    assert [p.name for p in named.parent.iterdir()] == ["ckpt"]
    # --tar keeps the server's tar; a destination in the way keeps the download and says where
    tar = saved("--format", "checkpoint", "--tar", "-o", tmp_path / "model.tar")
    assert tarfile.is_tarfile(tar) and tar == tmp_path / "model.tar"
    refused = cli(live_server, "models", "download", model_id, "--format", "checkpoint", "-o", folder)
    assert refused.returncode == 1, refused.stderr
    kept = refused.stderr.strip().splitlines()[-1].rsplit(" ", 1)[-1]
    assert tarfile.is_tarfile(kept) and Path(kept).parent == folder, refused.stderr


def show(server: Any, job_id: str) -> dict[str, Any]:
    return json.loads(ok(cli(server, "jobs", "show", job_id, "--json")).stdout)


def test_pause_resume_cancel_while_following(live_server: Any, worker_proc: Any) -> None:
    """`jobs follow` keeps following through pause and resume, and exits 3 when the job is cancelled."""
    file_id = upload(live_server)
    job_id = (
        ok(
            cli(
                live_server,
                "jobs",
                "create",
                "--file",
                file_id,
                "--max-steps",
                100000,
                "--checkpoint-every",
                0,
                "--eval-every",
                0,
                # eager: a pause waits for the step in progress, and a compile auto would start at
                # step 4 takes 20-80 s here, longer than this test waits for the pause
                "--no-compile",
            )
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    env = {
        **live_server.env,
        "FROMSCRATCH_SERVER": live_server.url,
        "FROMSCRATCH_API_KEY": live_server.api_key,
    }
    follower = subprocess.Popen(
        fromscratch_cmd("jobs", "follow", job_id),
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: show(live_server, job_id)["progress"]["step"] > 0,
            timeout=120,
            interval=1.0,
            message=f"job {job_id} to be running",
        )
        ok(cli(live_server, "jobs", "pause", job_id))
        paused = wait_until(
            lambda: (j := show(live_server, job_id))["status"] == "paused" and j,
            timeout=60,
            interval=0.5,
            message=f"job {job_id} to pause",
        )
        ok(cli(live_server, "jobs", "resume", job_id))
        wait_until(
            lambda: show(live_server, job_id)["progress"]["step"] > paused["progress"]["step"],
            timeout=120,
            interval=1.0,
            message=f"job {job_id} to go on after resume",
        )
        assert follower.poll() is None  # pause did not end the follow
        cancelled = ok(cli(live_server, "jobs", "cancel", job_id))
        assert job_id in cancelled.stdout
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 3, f"stdout:\n{out}\nstderr:\n{err}"
    assert "cancelled" in out
    # following a job that already ended answers at once with the same verdict
    again = cli(live_server, "jobs", "follow", job_id, "--json")
    assert again.returncode == 3 and json.loads(again.stdout)["status"] == "cancelled"
    # a finished job cannot be paused: one clear line, exit 1
    refused = cli(live_server, "jobs", "pause", job_id)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1


def test_errors_are_one_line_with_exit_codes(live_server: Any) -> None:
    bad_key = cli(live_server, "jobs", "list", api_key="fsk-not-a-key")
    assert bad_key.returncode == 1
    assert len(bad_key.stderr.strip().splitlines()) == 1 and "HTTP 401" in bad_key.stderr

    missing = cli(live_server, "jobs", "show", "ftjob-doesnotexist")
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

    file_id = upload(live_server)
    bad = cli(live_server, "jobs", "create", "--file", file_id, "--n-embd", 65)
    assert bad.returncode == 1 and "param: n_embd" in bad.stderr and "HTTP 400" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    unknown_file = cli(live_server, "jobs", "create", "--file", "file-nope")
    assert unknown_file.returncode == 1 and "training_file" in unknown_file.stderr

    usage = cli(live_server, "jobs", "create", "--max-steps", 10)  # --file is required
    assert usage.returncode == 2
    nothing = cli(live_server, "files", "upload", "/no/such/file.txt")
    assert nothing.returncode == 2 and "no such file" in nothing.stderr
    folder = cli(live_server, "files", "upload", str(Path(__file__).parent))
    assert folder.returncode == 2 and "is a folder: upload its files one at a time" in folder.stderr


def test_unreachable_server_is_one_clear_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROMSCRATCH_")}
    result = subprocess.run(
        fromscratch_cmd("files", "list", "--server", "http://127.0.0.1:9", "--api-key", "fsk-x"),
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "cannot reach the server at http://127.0.0.1:9" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

    no_key = subprocess.run(
        fromscratch_cmd("files", "list"), env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert no_key.returncode == 2 and "FROMSCRATCH_API_KEY" in no_key.stderr
