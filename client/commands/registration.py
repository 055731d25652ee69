"""The argparse tree of `fromscratch files|jobs|models`: `register(subparsers)` adds the three
command groups, each leaf with the connection options and its handler."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from client.commands.complete import cmd_models_complete
from client.commands.files import cmd_files_delete, cmd_files_list, cmd_files_upload
from client.commands.jobs import (
    DEFAULT_LIST_LIMIT,
    cmd_jobs_action,
    cmd_jobs_create,
    cmd_jobs_follow,
    cmd_jobs_list,
    cmd_jobs_show,
)
from client.commands.models import (
    DEFAULT_WAIT,
    cmd_models_delete,
    cmd_models_download,
    cmd_models_list,
    cmd_models_show,
)
from client.commands.runner import Handler, run_command
from client.hyperparameter_options import add_hyperparameter_options
from core.exports import DEFAULT_DOWNLOAD, DOWNLOADS
from core.status import JobStatus
from trainer.config import PRESETS
from trainer.config.export_formats import DEFAULT_DTYPE, DTYPE_NAMES, dtypes_by_format


def _connection_options() -> argparse.ArgumentParser:
    """The --server/--api-key options every command shares (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("server")
    # SUPPRESS: given at either level (`jobs --server X list` or `jobs list --server X`) it sticks.
    group.add_argument(
        "--server",
        default=argparse.SUPPRESS,
        help="server URL (env FROMSCRATCH_SERVER, default http://127.0.0.1:8000)",
    )
    group.add_argument("--api-key", default=argparse.SUPPRESS, help="API key (env FROMSCRATCH_API_KEY)")
    return common


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class _Leaves:
    """Adds a leaf command: the connection options, its handler, and `--json` where asked."""

    def __init__(self, common: argparse.ArgumentParser):
        self.common = common

    def __call__(
        self, group: Subparsers, name: str, help_text: str, handler: Handler, json_flag: bool = False
    ) -> argparse.ArgumentParser:
        p = group.add_parser(name, help=help_text, description=help_text, parents=[self.common])
        p.set_defaults(func=run_command(handler))
        if json_flag:
            p.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
        return p


def register(subparsers: Subparsers) -> None:
    """Add the `files`, `jobs` and `models` command groups to `fromscratch`'s subparsers."""
    leaf = _Leaves(_connection_options())
    _add_files(subparsers, leaf)
    _add_jobs(subparsers, leaf)
    _add_models(subparsers, leaf)


def _add_files(subparsers: Subparsers, leaf: _Leaves) -> None:
    files = subparsers.add_parser(
        "files", help="upload and list training files on a server", parents=[leaf.common]
    )
    files_sub = files.add_subparsers(dest="files_command", metavar="COMMAND", required=True)
    p = leaf(
        files_sub,
        "upload",
        "upload a training file (UTF-8 text or JSONL); prints its id",
        cmd_files_upload,
        json_flag=True,
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--purpose", default="fine-tune", help="file purpose")
    leaf(files_sub, "list", "list your uploaded files", cmd_files_list, json_flag=True)
    p = leaf(files_sub, "delete", "delete an uploaded file", cmd_files_delete, json_flag=True)
    p.add_argument("id", metavar="FILE_ID")


def _add_jobs(subparsers: Subparsers, leaf: _Leaves) -> None:
    jobs = subparsers.add_parser(
        "jobs", help="create, follow and control training jobs on a server", parents=[leaf.common]
    )
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True)
    p = leaf(jobs_sub, "create", "start a training job; prints its id", cmd_jobs_create, json_flag=True)
    p.add_argument(
        "--file", required=True, metavar="FILE_ID", help="training file id (files upload prints it)"
    )
    p.add_argument(
        "--model",
        default="llama-tiny",
        metavar="PRESET",
        help=f"a preset ({', '.join(PRESETS)}) or the id of a model you trained (continue training)",
    )
    p.add_argument("--validation-file", metavar="FILE_ID", help="validation file id")
    p.add_argument("--suffix", help="added to the fine-tuned model's name")
    p.add_argument(
        "--seed",
        type=int,
        help="random seed (default: one the server draws, shown on the job, as OpenAI does)",
    )
    p.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="job metadata (repeatable)")
    p.add_argument("--idempotency-key", help="a retried create with the same key returns the same job")
    p.add_argument("--follow", action="store_true", help="follow the job after creating it (as jobs follow)")
    add_hyperparameter_options(p)
    p = leaf(jobs_sub, "list", "list your jobs, newest first", cmd_jobs_list, json_flag=True)
    p.add_argument("--after", metavar="JOB_ID", help="the page after this job id")
    p.add_argument("--limit", type=int, default=DEFAULT_LIST_LIMIT, help="jobs per page")
    p.add_argument("--status", choices=[s.value for s in JobStatus], help="only jobs in this status")
    p.add_argument(
        "--metadata",
        action="append",
        metavar="KEY=VALUE",
        help="only jobs whose metadata holds it (repeatable)",
    )
    p = leaf(jobs_sub, "show", "show one job", cmd_jobs_show, json_flag=True)
    p.add_argument("id", metavar="JOB_ID")
    p = leaf(
        jobs_sub,
        "follow",
        "follow a job live until it ends (exit 1 failed, 3 cancelled)",
        cmd_jobs_follow,
        json_flag=True,
    )
    p.add_argument("id", metavar="JOB_ID")
    for action, text in (
        ("cancel", "cancel a job"),
        ("pause", "pause a running job (keeps a checkpoint)"),
        ("resume", "resume a paused job from its checkpoint"),
    ):
        p = leaf(jobs_sub, action, text, cmd_jobs_action, json_flag=True)
        p.add_argument("id", metavar="JOB_ID")
        p.set_defaults(action=action)


def _add_models(subparsers: Subparsers, leaf: _Leaves) -> None:
    models = subparsers.add_parser(
        "models", help="list, show, try, delete and download trained models", parents=[leaf.common]
    )
    models_sub = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    leaf(
        models_sub,
        "list",
        "list your models (finished jobs and their checkpoints)",
        cmd_models_list,
        json_flag=True,
    )
    for name, text, handler in (
        ("show", "show one model (its context length, formats, job)", cmd_models_show),
        ("delete", "delete a model or checkpoint", cmd_models_delete),
    ):
        leaf(models_sub, name, text, handler, json_flag=True).add_argument("id", metavar="MODEL_ID")
    _add_complete(leaf(models_sub, "complete", "stream a completion from a model", cmd_models_complete))
    p = leaf(
        models_sub,
        "download",
        f"download a model: {', '.join(d.title for d in DOWNLOADS)}",
        cmd_models_download,
    )
    p.add_argument("id", metavar="MODEL_ID")
    p.add_argument(
        "--format",
        choices=[d.name for d in DOWNLOADS],
        default=DEFAULT_DOWNLOAD,
        help=f"what to download (default: {DEFAULT_DOWNLOAD})",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        default=DEFAULT_DTYPE,
        help=f"weights precision of an export ({dtypes_by_format()}) (default: {DEFAULT_DTYPE})",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT,
        metavar="SECONDS",
        help="how long to wait for a worker to prepare an export the server has not made yet "
        f"(default: {DEFAULT_WAIT:g})",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="file or folder to write (default: the server's file name in the current folder); a "
        "folder format is unpacked into PATH, or into its own folder inside PATH when PATH is a folder",
    )
    p.add_argument(
        "--tar",
        action="store_true",
        help="keep a folder format (hf, checkpoint) as the one tar the server sends, not unpacked",
    )


def _add_complete(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="MODEL_ID")
    p.add_argument("prompt", metavar="PROMPT")
    p.add_argument("--chat", action="store_true", help="send PROMPT as a user message to the chat API")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default: 64)")
    p.add_argument("--temperature", type=float, help="0 is greedy (default: the server's, 1)")
    p.add_argument("--top-p", type=float, help="nucleus sampling")
    p.add_argument("--seed", type=int, help="the same seed gives the same text")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop sequence (repeatable, up to 4)")
