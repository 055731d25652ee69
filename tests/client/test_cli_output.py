"""The client's output where it is not a terminal (a pipe, a file): tables as tab-separated full
values, and `jobs follow`'s progress as lines written and flushed as they come."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from cli.main import SIGPIPE_EXIT
from client.commands.follow import _FollowState
from client.commands.follow_display import LineDisplay, describe, summary_rows
from client.commands.jobs import job_details, jobs_rows
from client.commands.output import print_details, print_rows

LONG_MODEL = "ft:llama-tiny:a-rather-long-suffix-that-would-not-fit-in-eighty-columns:0123456789abcdef"


def job(**over: Any) -> dict[str, Any]:
    return {
        "id": "ftjob-0123456789abcdef0123456789abcdef",
        "status": "running",
        "model": LONG_MODEL,
        "created_at": 1_700_000_000,
        "finished_at": None,
        "training_file": "file-0123456789abcdef",
        "hyperparameters": {"max_steps": 300},
        "progress": {
            "step": 30,
            "total_steps": 300,
            "train_loss": 2.5,
            "val_loss": None,
            "eta_seconds": 270.0,
        },
        **over,
    }


class Flushed(io.StringIO):
    """A stream that is not a terminal and counts its flushes."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_a_list_is_tab_separated_full_values_with_a_header() -> None:
    out = Flushed()
    print_rows(*jobs_rows([job(), job(id="ftjob-2", status="queued", progress={})]), stream=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split("\t") == [
        "ID",
        "Status",
        "Model",
        "Suffix",
        "Step",
        "Train loss",
        "Val loss",
        "Created",
        "Finished",
    ]
    first = lines[1].split("\t")
    assert first[:5] == ["ftjob-0123456789abcdef0123456789abcdef", "running", LONG_MODEL, "-", "30/300"]
    assert first[5:7] == ["2.5000", "-"]
    assert lines[2].split("\t")[:5] == ["ftjob-2", "queued", LONG_MODEL, "-", "-"]
    assert "…" not in out.getvalue() and out.flushes == 1


def test_details_are_key_tab_value_lines_without_the_empty_ones() -> None:
    out = io.StringIO()
    print_details([*job_details(job()), ("note", "two\tcells\nand lines")], stream=out)
    pairs = [line.split("\t") for line in out.getvalue().splitlines()]
    assert all(len(p) == 2 for p in pairs)  # a tab or newline inside a value cannot split it
    shown = dict(pairs)
    assert shown["id"] == "ftjob-0123456789abcdef0123456789abcdef" and shown["model"] == LONG_MODEL
    assert shown["ETA"] == "4m30s" and "validation file" not in shown and "fine-tuned model" not in shown
    assert shown["note"] == "two cells and lines"


def test_follow_prints_a_line_per_change_at_once() -> None:
    now = [0.0]
    state = _FollowState(job(status="queued", progress={"step": 0, "total_steps": 300}))
    out = Flushed()
    with LineDisplay(state, out, clock=lambda: now[0]) as display:
        assert out.getvalue().splitlines()[-1].startswith("queued")  # at once, before any event
        state.event("status", {"status": "running", "job": job(progress={"step": 0, "total_steps": 300})})
        display.refresh()
        for step in range(1, 21):  # a replayed history arrives in one burst: no line per step
            state.metric({"step": step, "train_loss": 3.0 - step / 100})
            display.refresh()
        now[0] = 1.5
        state.metric({"step": 21, "train_loss": 2.7})
        display.refresh()
        display.refresh()  # nothing new: no line
    lines = out.getvalue().splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["queued", "step", "0/300"],
        ["running", "step", "0/300"],
        ["running", "step", "21/300"],
    ]
    assert "loss 2.7000" in lines[-1]
    assert out.flushes == len(lines)  # every line leaves at once (no 12 s of silence in a pipe)


def test_follow_eta_counts_down_from_the_servers_smoothed_rate() -> None:
    state = _FollowState(job())  # step 30 of 300, the server's ETA 270 s: 1 s per step
    assert state.eta == 270.0
    state.metric({"step": 60, "train_loss": 2.0, "tokens_per_s": 99999.0})
    assert state.eta == 240.0 and state.tokens_per_s is None  # a single step's rate is not shown
    state.job_update(
        job(progress={"step": 100, "total_steps": 300, "eta_seconds": 400.0, "tokens_per_s": 512.0})
    )
    assert state.eta == 400.0 and state.tokens_per_s == 512.0
    state.job_update(job(status="succeeded", progress={"step": 300, "total_steps": 300, "eta_seconds": None}))
    assert state.eta is None


def test_the_summary_is_plain_lines_too() -> None:
    out = io.StringIO()
    done = job(
        status="succeeded",
        started_at=1_700_000_020,
        finished_at=1_700_000_145,
        trained_tokens=123456,
        fine_tuned_model=LONG_MODEL,
    )
    print_details(summary_rows(done, 300, 300, 1.5, None), stream=out)
    shown = dict(line.split("\t") for line in out.getvalue().splitlines())
    assert shown["status"] == "succeeded" and shown["steps"] == "300/300" and shown["model"] == LONG_MODEL
    assert shown["trained tokens"] == "123,456" and shown["run time"] == "2m05s"
    assert shown["waited in queue"] == "20s"  # created -> started: not run time


def test_keys_list_is_tab_separated_or_json(tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    from cli.main import main

    monkeypatch.delenv("FROMSCRATCH_DATABASE_URL", raising=False)
    monkeypatch.setenv("FROMSCRATCH_DATA_DIR", str(tmp_path))  # --data-dir sets it: restored after the test
    name = "a key name longer than the twenty characters the list used to keep"
    assert main(["keys", "create", "--name", name, "--data-dir", str(tmp_path)]) == 0
    said = capsys.readouterr().err
    assert f"in sqlite:///{tmp_path}/fromscratch.db; the secret is shown only once" in said  # which database
    assert main(["keys", "list", "--data-dir", str(tmp_path)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split("\t") == ["ID", "Name", "Owner", "Created", "Revoked"]
    assert row.split("\t")[1] == name and row.split("\t")[0].startswith("key-")
    assert main(["keys", "list", "--json", "--data-dir", str(tmp_path)]) == 0
    [key] = json.loads(capsys.readouterr().out)["data"]
    assert key["name"] == name and key["revoked_at"] is None and isinstance(key["created_at"], int)


@pytest.mark.parametrize("json_output", [False, True])
def test_output_into_a_closed_pipe_ends_quietly(json_output: bool, tmp_path: Any) -> None:
    """`fromscratch jobs list | head -1`: the reader is gone before the command writes."""
    env = {k: v for k, v in os.environ.items() if k != "FROMSCRATCH_DATABASE_URL"}
    env["FROMSCRATCH_DATA_DIR"] = str(tmp_path)
    command = [sys.executable, "-m", "cli.main", "keys"]
    subprocess.run([*command, "create", "--name", "k"], stdout=subprocess.DEVNULL, env=env, check=True)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        listing = [*command, "list", *(["--json"] if json_output else [])]
        done = subprocess.run(listing, stdout=write_end, stderr=subprocess.PIPE, env=env)
    finally:
        os.close(write_end)
    assert done.stderr == b"" and done.returncode == SIGPIPE_EXIT, done.stderr.decode()


def test_follow_shows_the_step_of_a_validation_loss_from_an_earlier_step() -> None:
    state = _FollowState(job(progress={"step": 10, "total_steps": 300, "val_loss": None}))
    state.metric({"step": 20, "train_loss": 2.5, "val_loss": 2.6})
    state.metric({"step": 30, "train_loss": 2.4})  # its evaluation not in yet
    assert "val 2.6000 @20 " in describe(state)
    state.metric({"step": 30, "train_loss": 2.4, "val_loss": 2.45})  # a catch-up poll fills it in
    state.metric({"step": 20, "train_loss": 2.5, "val_loss": 2.6})  # an older point changes nothing
    assert "val 2.4500 " in describe(state) and "@" not in describe(state)


def test_follow_and_show_say_why_a_queued_job_cannot_start() -> None:
    reason = "no live worker consumes queue 'gpu' (GET /v1/workers): the job starts when one does"
    state = _FollowState(job(status="queued", waiting_for=reason, progress={"step": 0, "total_steps": 9}))
    out = Flushed()
    with LineDisplay(state, out, clock=lambda: 0.0) as display:
        state.job_update(job(status="queued", waiting_for=None, progress={"step": 0, "total_steps": 9}))
        display.refresh()  # the reason went (a worker started): a line says so at once
    first, second = out.getvalue().splitlines()
    assert first.endswith(f"(waiting: {reason})") and "waiting" not in second
    assert dict(job_details(job(status="queued", waiting_for=reason)))["waiting for"] == reason


def test_follow_says_a_paused_job_is_followed_until_it_is_resumed() -> None:
    state = _FollowState(job(status="paused"))
    assert describe(state).endswith("(paused: following until it is resumed and ends; Ctrl-C stops)")
    state.job_update(job(status="running"))
    assert "paused" not in describe(state)
