"""`fromscratch jobs create|list|show|follow|cancel|pause|resume`: training jobs on the server
(the live display of `follow` is in client.commands.follow)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from client.commands.follow import follow_job
from client.commands.output import (
    format_duration,
    format_number,
    format_progress,
    format_time,
    print_details,
    print_json,
    print_rows,
)
from client.commands.runner import EXIT_OK, UsageError, connect
from client.hyperparameter_options import hyperparameters_from_args
from core.status import TERMINAL

DEFAULT_LIST_LIMIT = 20  # jobs a `jobs list` page shows


def metadata_pairs(items: list[str]) -> dict[str, str]:
    """--metadata KEY=VALUE options as a dict."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--metadata wants KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


def cmd_jobs_create(args: argparse.Namespace) -> int:
    """`jobs create`: start a job from the options given; print its id (then follow it)."""
    body: dict[str, Any] = {"model": args.model, "training_file": args.file}
    if args.validation_file:
        body["validation_file"] = args.validation_file
    if args.suffix:
        body["suffix"] = args.suffix
    if args.seed is not None:
        body["seed"] = args.seed
    if args.metadata:
        body["metadata"] = metadata_pairs(args.metadata)
    hp = hyperparameters_from_args(args)
    if hp:
        body["hyperparameters"] = hp
    with connect(args) as client:
        job = client.create_job(body, idempotency_key=args.idempotency_key)
        if args.json:
            print_json(job)
        else:
            print(f"created job {job['id']} ({job.get('status')}, model {job.get('model')})", file=sys.stderr)
            print(job["id"])
        if args.follow:
            return follow_job(client, job["id"], json_summary=False)
    return EXIT_OK


def cmd_jobs_list(args: argparse.Namespace) -> int:
    """`jobs list`: one page of your jobs, newest first, as a table."""
    with connect(args) as client:
        page = client.list_jobs(
            after=args.after,
            limit=args.limit,
            status=args.status,
            metadata=metadata_pairs(args.metadata or []),
        )
    if args.json:
        print_json(page)
        return EXIT_OK
    print_rows(*jobs_rows(page.get("data", [])))
    if page.get("has_more") and page.get("data"):
        same = f" --limit {args.limit}" if args.limit != DEFAULT_LIST_LIMIT else ""  # the same page size
        same += f" --status {args.status}" if args.status else ""
        same += "".join(f" --metadata {shlex.quote(item)}" for item in args.metadata or [])
        print(f"more: fromscratch jobs list --after {page['data'][-1]['id']}{same}", file=sys.stderr)
    return EXIT_OK


def jobs_rows(jobs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The columns of `jobs list` and a row per job."""
    headers = ["ID", "Status", "Model", "Suffix", "Step", "Train loss", "Val loss", "Created", "Finished"]
    rows = []
    for job in jobs:
        p = job.get("progress") or {}
        rows.append(
            [
                job.get("id", "?"),
                job.get("status", "?"),
                job.get("model", "-"),
                job.get("suffix") or "-",
                format_progress(job),
                format_number(p.get("train_loss")),
                format_number(p.get("val_loss")),
                format_time(job.get("created_at"), short=True),
                format_time(job.get("finished_at"), short=True),
            ]
        )
    return headers, rows


def job_details(job: dict[str, Any]) -> list[tuple[str, object]]:
    """The fields of `jobs show`, in order (empty ones are left out when printed)."""
    p = job.get("progress") or {}
    rows: list[tuple[str, object]] = [
        ("id", job.get("id")),
        ("status", job.get("status")),
        ("waiting for", job.get("waiting_for")),
        ("model", job.get("model")),
        ("suffix", job.get("suffix")),
        ("metadata", ", ".join(f"{k}={v}" for k, v in (job.get("metadata") or {}).items()) or None),
        ("training file", job.get("training_file")),
        ("validation file", job.get("validation_file")),
        ("step", format_progress(job)),
        ("train loss", format_number(p.get("train_loss"))),
        ("val loss", format_number(p.get("val_loss"))),
        ("tokens/s", format_number(p.get("tokens_per_s"), ",.0f")),
        ("ETA", format_duration(p.get("eta_seconds")) if job.get("status") not in TERMINAL else None),
        (
            "trained tokens",
            f"{job['trained_tokens']:,}" if isinstance(job.get("trained_tokens"), int) else None,
        ),
        ("fine-tuned model", job.get("fine_tuned_model")),
        ("created", format_time(job.get("created_at"))),
        ("finished", format_time(job.get("finished_at"))),
    ]
    err = job.get("error") or {}
    if err.get("message"):
        rows.append(("error", f"{err.get('message')} [{err.get('code') or '-'}]"))
    hp = job.get("hyperparameters") or {}
    if hp:
        rows.append(("hyperparameters", ", ".join(f"{k}={v}" for k, v in hp.items())))
    return rows


def cmd_jobs_show(args: argparse.Namespace) -> int:
    """`jobs show JOB_ID`: one job's details."""
    with connect(args) as client:
        job = client.get_job(args.id)
        final = None
        if job.get("fine_tuned_model") and not args.json:
            final = next((c for c in client.checkpoints(args.id).get("data", []) if c.get("is_final")), None)
    if args.json:
        print_json(job)
        return EXIT_OK
    rows = job_details(job)
    if final is not None:  # the model's own step and losses: an earlier best's when the run went past it
        m = final.get("metrics") or {}
        losses = [
            ("train loss", "train_loss"),
            ("val loss", "valid_loss"),
            ("full val loss", "full_valid_loss"),
        ]
        shown = (
            f"{final.get('step_number')} ("
            + ", ".join(f"{label} {format_number(m[key])}" for label, key in losses if m.get(key) is not None)
            + ")"
        )
        rows.insert(
            next(i for i, (k, _) in enumerate(rows) if k == "fine-tuned model") + 1, ("model step", shown)
        )
    print_details(rows)
    return EXIT_OK


def cmd_jobs_action(args: argparse.Namespace) -> int:
    """`jobs cancel|pause|resume JOB_ID`: apply the action; print the new status."""
    with connect(args) as client:
        job = client.job_action(args.id, args.action)
    if args.json:
        print_json(job)
    else:
        print(f"{args.id}: {job.get('status')}")
    return EXIT_OK


def cmd_jobs_follow(args: argparse.Namespace) -> int:
    """`jobs follow JOB_ID`: the live progress until the job ends."""
    with connect(args) as client:
        return follow_job(client, args.id, json_summary=args.json)
