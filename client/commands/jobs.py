"""`fromscratch jobs create|list|show|follow|cancel|pause|resume`: training jobs on the server
(the live display of `follow` is in client.commands.follow)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from client.commands.follow import follow_job
from client.commands.output import (
    add_id_column,
    format_duration,
    format_number,
    format_progress,
    format_time,
    make_console,
    print_json,
)
from client.commands.runner import EXIT_OK, UsageError, connect
from client.hyperparameter_options import hyperparameters_from_args
from core.status import TERMINAL

if TYPE_CHECKING:
    from rich.table import Table


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
        meta = {}
        for item in args.metadata:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise UsageError(f"--metadata wants KEY=VALUE, got {item!r}")
            meta[key] = value
        body["metadata"] = meta
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

    from rich.table import Table

    with connect(args) as client:
        page = client.list_jobs(after=args.after, limit=args.limit)
    if args.json:
        print_json(page)
        return EXIT_OK
    jobs = page.get("data", [])
    table = Table("Status", "Model", "Step", "Train loss", "Val loss", "Created", "Finished")
    add_id_column(table, jobs)
    for job in jobs:
        p = job.get("progress") or {}
        table.add_row(
            job.get("id", "?"),
            job.get("status", "?"),
            job.get("model", "-"),
            format_progress(job),
            format_number(p.get("train_loss")),
            format_number(p.get("val_loss")),
            format_time(job.get("created_at"), short=True),
            format_time(job.get("finished_at"), short=True),
        )
    console = make_console()
    console.print(table)
    if page.get("has_more") and page.get("data"):
        console.print(f"more: fromscratch jobs list --after {page['data'][-1]['id']}")
    return EXIT_OK


def _job_table(job: dict[str, Any]) -> Table:
    """The details of one job as a two-column table (empty fields left out)."""

    from rich.table import Table

    p = job.get("progress") or {}
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("id", job.get("id")),
        ("status", job.get("status")),
        ("model", job.get("model")),
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
    for key, value in rows:
        if value not in (None, ""):
            table.add_row(key, str(value))
    return table


def cmd_jobs_show(args: argparse.Namespace) -> int:
    """`jobs show JOB_ID`: one job's details."""
    with connect(args) as client:
        job = client.get_job(args.id)
    if args.json:
        print_json(job)
    else:
        make_console().print(_job_table(job))
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
