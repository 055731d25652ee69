"""`fromscratch files|jobs|models ...`: the command-line client of a running fromscratch server.

Every command takes `--server` (env FROMSCRATCH_SERVER, default http://127.0.0.1:8000) and
`--api-key` (env FROMSCRATCH_API_KEY), and talks only to the public /v1 API through api.client.

Output conventions: commands that create something print its id alone on stdout (so
`FILE=$(fromscratch files upload data.txt)` works) and the human details on stderr; list and show
commands print a table, or the API's JSON with `--json`. Progress bars go to stderr.
Exit codes: 0 ok; 1 an API or network error (printed as one line); 2 bad usage;
`jobs follow`: 1 when the job failed, 3 when it was cancelled, 130 on Ctrl-C (the job goes on).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from trainer.config import MODEL_FIELDS, PRESETS, ModelConfig, TrainConfig

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
TERMINAL = ("succeeded", "failed", "cancelled")
FORMATS = ("gguf", "hf", "onnx", "checkpoint")

# TrainConfig fields that are not job options.
_NOT_JOB_OPTIONS = {"extra"}
# OpenAI's hyperparameters that also accept "auto".
_AUTO_OK = {"n_epochs", "batch_size"}
# What a None default means (the rules live in TrainConfig's resolved_* properties).
_NONE_MEANS = {
    "vocab_size": "258 for byte, 4096 for bpe",
    "max_steps": "1000 steps unless --n-epochs is given",
    "n_epochs": "none: --max-steps decides",
    "min_lr": "learning_rate / 10",
    "warmup_steps": "min(100, total_steps / 10)",
    "cos_decay_steps": "total steps",
    "time_limit": "none",
}


class UsageError(Exception):
    """A mistake in how the command was called (exit code 2)."""


# -- hyperparameter options generated from the trainer's config --------------------------------
def _base_type(tp: Any) -> tuple[type, tuple[Any, ...] | None]:
    """(python type, choices) for a dataclass field annotation like `int | None` or Literal[...]."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return _base_type(args[0])
    if typing.get_origin(tp) is typing.Literal:
        return str, tuple(typing.get_args(tp))
    return tp, None


def _auto_or(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return "auto" if text == "auto" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def hyperparameter_specs() -> list[dict[str, Any]]:
    """One entry per job hyperparameter option: name, python type, choices, default, help.
    Names and defaults come from trainer.config, so they match `fromscratch train`."""
    specs: list[dict[str, Any]] = []
    model_hints = typing.get_type_hints(ModelConfig)
    for name in MODEL_FIELDS:
        kind, choices = _base_type(model_hints[name])
        tiny = PRESETS["llama-tiny"].get(name)
        default_text = "from the preset" + (f" (llama-tiny: {tiny})" if tiny is not None else "")
        specs.append(dict(name=name, kind=kind, choices=choices, default_text=default_text, group="model"))
    train_hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        if f.name in _NOT_JOB_OPTIONS or f.name == "seed":
            continue  # seed is the job's top-level `seed`
        kind, choices = _base_type(train_hints[f.name])
        default = f.default if f.default is not MISSING else None
        specs.append(dict(name=f.name, kind=kind, choices=choices, group="train",
                          default_text=_NONE_MEANS.get(f.name, "none") if default is None else f"{default}"))
    return specs


def _add_hyperparameter_options(parser: argparse.ArgumentParser) -> None:
    groups = {
        "model": parser.add_argument_group("architecture (override the preset; only the options given are sent)"),
        "train": parser.add_argument_group("training hyperparameters (as in `fromscratch train`; "
                                           "only the options given are sent)"),
    }
    for spec in hyperparameter_specs():
        name, kind = spec["name"], spec["kind"]
        flag = "--" + name.replace("_", "-")
        group = groups[spec["group"]]
        help_text = f"default: {spec['default_text']}"
        dest = "hp_" + name
        if kind is bool:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                               help=help_text)
        elif spec["choices"]:
            group.add_argument(flag, dest=dest, choices=spec["choices"], default=None, help=help_text)
        else:
            parse = _auto_or(kind) if name in _AUTO_OK else kind
            group.add_argument(flag, dest=dest, type=parse, default=None,
                               metavar=name.upper(), help=help_text)
    groups["train"].add_argument("--learning-rate-multiplier", dest="hp_learning_rate_multiplier",
                                 type=_auto_or(float), default=None, metavar="X",
                                 help="OpenAI's multiplier of the default learning rate, or auto")


def hyperparameters_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {key[3:]: value for key, value in vars(args).items() if key.startswith("hp_") and value is not None}


# -- plumbing ----------------------------------------------------------------------------------
def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _client(args: argparse.Namespace) -> Any:
    from api.client import DEFAULT_SERVER, Client

    server = getattr(args, "server", None) or os.environ.get("FROMSCRATCH_SERVER") or DEFAULT_SERVER
    api_key = getattr(args, "api_key", None) or os.environ.get("FROMSCRATCH_API_KEY")
    if not api_key:
        raise UsageError("no API key: pass --api-key or set FROMSCRATCH_API_KEY "
                         "(`fromscratch keys create --name NAME` makes one)")
    return Client(server, api_key)


def _run(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: API errors become one line on stderr and exit 1; usage errors exit 2."""
    from api.client import APIError

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except UsageError as e:
            print(f"fromscratch: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except APIError as e:
            print(f"fromscratch: error: {e.one_line()}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print("fromscratch: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def _when(ts: Any, short: bool = False) -> str:
    if not isinstance(ts, int | float) or ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def _id_column(table: Any, rows: list[dict[str, Any]]) -> None:
    """A first ID column that is never cut or wrapped: ids are what users copy."""
    from rich.table import Column

    width = max([len(str(r.get("id", ""))) for r in rows] + [2])
    table.columns.insert(0, Column("ID", no_wrap=True, min_width=width))


def _num(value: Any, fmt: str = ".4f") -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _size(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _progress_text(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    step, total = p.get("step"), p.get("total_steps")
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


# -- files -------------------------------------------------------------------------------------
def cmd_files_upload(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    size = path.stat().st_size
    with _client(args) as client, Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=_console(stderr=True), transient=False,
    ) as bar:
        task = bar.add_task(f"uploading {path.name}", total=size)
        obj = client.upload_file(path, purpose=args.purpose, progress=lambda n: bar.advance(task, n))
    if args.json:
        _print_json(obj)
    else:
        print(f"uploaded {path.name} ({_size(obj.get('bytes', size))}) as {obj['id']}", file=sys.stderr)
        print(obj["id"])
    return EXIT_OK


def cmd_files_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    with _client(args) as client:
        page = client.list_files()
    if args.json:
        _print_json(page)
        return EXIT_OK
    files = page.get("data", [])
    table = Table("Filename", "Size", "Purpose", "Created")
    _id_column(table, files)
    for f in files:
        table.add_row(f.get("id", "?"), f.get("filename", "-"), _size(f.get("bytes")), f.get("purpose", "-"),
                      _when(f.get("created_at")))
    _console().print(table)
    return EXIT_OK


# -- jobs --------------------------------------------------------------------------------------
def cmd_jobs_create(args: argparse.Namespace) -> int:
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
    with _client(args) as client:
        job = client.create_job(body, idempotency_key=args.idempotency_key)
        if args.json:
            _print_json(job)
        else:
            print(f"created job {job['id']} ({job.get('status')}, model {job.get('model')})", file=sys.stderr)
            print(job["id"])
        if args.follow:
            return follow_job(client, job["id"], json_summary=False)
    return EXIT_OK


def cmd_jobs_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    with _client(args) as client:
        page = client.list_jobs(after=args.after, limit=args.limit)
    if args.json:
        _print_json(page)
        return EXIT_OK
    jobs = page.get("data", [])
    table = Table("Status", "Model", "Step", "Train loss", "Val loss", "Created", "Finished")
    _id_column(table, jobs)
    for job in jobs:
        p = job.get("progress") or {}
        table.add_row(job.get("id", "?"), job.get("status", "?"), job.get("model", "-"), _progress_text(job),
                      _num(p.get("train_loss")), _num(p.get("val_loss")), _when(job.get("created_at"), short=True),
                      _when(job.get("finished_at"), short=True))
    console = _console()
    console.print(table)
    if page.get("has_more") and page.get("data"):
        console.print(f"more: fromscratch jobs list --after {page['data'][-1]['id']}")
    return EXIT_OK


def _job_table(job: dict[str, Any]) -> Any:
    from rich.table import Table

    p = job.get("progress") or {}
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("id", job.get("id")), ("status", job.get("status")), ("model", job.get("model")),
        ("training file", job.get("training_file")), ("validation file", job.get("validation_file")),
        ("step", _progress_text(job)), ("train loss", _num(p.get("train_loss"))),
        ("val loss", _num(p.get("val_loss"))),
        ("tokens/s", _num(p.get("tokens_per_s"), ",.0f")),
        ("ETA", _duration(p.get("eta_seconds")) if job.get("status") not in TERMINAL else None),
        ("trained tokens", f"{job['trained_tokens']:,}" if isinstance(job.get("trained_tokens"), int) else None),
        ("fine-tuned model", job.get("fine_tuned_model")),
        ("created", _when(job.get("created_at"))), ("finished", _when(job.get("finished_at"))),
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
    with _client(args) as client:
        job = client.get_job(args.id)
    if args.json:
        _print_json(job)
    else:
        _console().print(_job_table(job))
    return EXIT_OK


def cmd_jobs_action(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job_action(args.id, args.action)
    if args.json:
        _print_json(job)
    else:
        print(f"{args.id}: {job.get('status')}")
    return EXIT_OK


class _FollowState:
    """What `jobs follow` knows about the job, fed by stream events, polls and job reads."""

    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.status: str = job.get("status", "?")
        p = job.get("progress") or {}
        self.step: int = p.get("step") or 0
        self.total: int | None = p.get("total_steps")
        self.train_loss: float | None = p.get("train_loss")
        self.val_loss: float | None = p.get("val_loss")
        self.tokens_per_s: float | None = p.get("tokens_per_s")
        self.eta: float | None = p.get("eta_seconds")
        self.last_event_id: str | None = None
        self._rate_origin: tuple[float, int] | None = None  # (created_at, step) for a local ETA
        self.plain_stream = False  # the server refused a made-up Last-Event-ID: start from scratch

    def job_update(self, job: dict[str, Any]) -> None:
        self.job = {**self.job, **job}
        self.status = job.get("status", self.status)
        p = job.get("progress") or {}
        if isinstance(p.get("step"), int) and p["step"] >= self.step:
            self.step = p["step"]
            for attr, key in (("train_loss", "train_loss"), ("val_loss", "val_loss"),
                              ("tokens_per_s", "tokens_per_s")):
                if p.get(key) is not None:
                    setattr(self, attr, p[key])
            self.eta = p.get("eta_seconds")
        if p.get("total_steps"):
            self.total = p["total_steps"]

    def metric(self, m: dict[str, Any]) -> None:
        step = m.get("step")
        if not isinstance(step, int):
            return
        val = m.get("val_loss", m.get("valid_loss"))
        if val is not None:
            self.val_loss = val
        if step < self.step:
            return  # an older point (a catch-up poll overlapping the stream)
        self.step = step
        if m.get("train_loss") is not None:
            self.train_loss = m["train_loss"]
        if m.get("tokens_per_s") is not None:
            self.tokens_per_s = m["tokens_per_s"]
        # ETA from the steps' own timestamps (server time), so a burst of replayed points does not
        # look infinitely fast; the server's eta_seconds stands until a second of history exists.
        t = m.get("created_at")
        if not isinstance(t, int | float):
            return
        if self._rate_origin is None or step < self._rate_origin[1]:
            self._rate_origin = (t, step)
        else:
            t0, s0 = self._rate_origin
            if step > s0 and t - t0 >= 1.0 and self.total:
                self.eta = max(0.0, (self.total - step) * (t - t0) / (step - s0))

    def event(self, name: str, data: Any) -> None:
        """Apply one SSE event of the job stream: `metrics` (a point as in /metrics), `status`
        ({status, message, created_at, job}); `message` events (lifecycle notes) change nothing here."""
        if not isinstance(data, dict):
            return
        if name == "metrics":
            self.metric(data)
        elif name == "status":
            if isinstance(data.get("job"), dict):
                self.job_update(data["job"])
            elif isinstance(data.get("status"), str):
                self.status = data["status"]

    def resume_id(self) -> str | None:
        """Last-Event-ID for the next connection: the stream's ids are "<step>.<seq>"; start after
        the newest step known, whether the stream or a poll brought it."""
        m = re.fullmatch(r"(-?\d+)\.(\d+)", self.last_event_id or "")
        if m:
            return f"{max(int(m.group(1)), self.step)}.{m.group(2)}"
        if self.last_event_id:
            return self.last_event_id
        return f"{self.step}.0" if self.step > 0 and not self.plain_stream else None


def follow_job(client: Any, job_id: str, json_summary: bool = False, poll_seconds: float = 2.0) -> int:
    """Show a live progress bar until the job is terminal: SSE first, polling /metrics when the
    stream drops (reconnecting with Last-Event-ID now and then). Returns the exit code."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from api.client import APIError

    state = _FollowState(client.get_job(job_id))
    console = _console(stderr=True)

    def describe() -> str:
        eta = _duration(state.eta) if state.eta is not None else "-"
        tps = _num(state.tokens_per_s, ",.0f")
        return (f"loss {_num(state.train_loss)}  val {_num(state.val_loss)}  {tps} tok/s  ETA {eta}")

    with Progress(TextColumn("[bold]{task.fields[status]:<16}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), console=console, transient=False) as bar:
        task = bar.add_task("train", total=state.total, completed=state.step, status=state.status,
                            info=describe())

        def refresh() -> None:
            bar.update(task, total=state.total, completed=state.step, status=state.status, info=describe())

        stream_failures = 0
        next_stream_try = 0.0
        last_job_read, job_read_seconds = time.monotonic(), 5.0
        while state.status not in TERMINAL:
            if time.monotonic() >= next_stream_try:
                try:
                    for ev in client.stream(job_id, state.resume_id()):
                        if ev.id:
                            state.last_event_id = ev.id
                        try:
                            state.event(ev.event, ev.json())
                        except ValueError:
                            continue
                        stream_failures = 0
                        if state.status in TERMINAL:
                            refresh()
                            break
                        if time.monotonic() - last_job_read >= job_read_seconds:
                            # the job itself now and then: total steps and the server's ETA
                            state.job_update(client.get_job(job_id))
                            last_job_read = time.monotonic()
                        refresh()
                except APIError as e:
                    if e.status_code == 400 and e.param == "Last-Event-ID" and not state.plain_stream:
                        state.last_event_id, state.plain_stream = None, True
                        continue
                    if e.status_code in (401, 403, 404):
                        raise
                    stream_failures += 1
                    # back off the stream; poll in between
                    next_stream_try = time.monotonic() + min(30.0, 2.0 * stream_failures)
            # the stream ended or dropped: catch up by polling (fills any gap) and re-read the job
            page = client.metrics(job_id, after_step=state.step, limit=1000)
            for m in page.get("data", []):
                state.metric(m)
            state.job_update(client.get_job(job_id))
            refresh()
            if state.status not in TERMINAL:
                time.sleep(poll_seconds)
        state.job_update(client.get_job(job_id))
        refresh()

    job = state.job
    if json_summary:
        _print_json(job)
    else:
        _console().print(_summary_table(job, state))
    return {"succeeded": EXIT_OK, "cancelled": EXIT_CANCELLED}.get(job.get("status", ""), EXIT_ERROR)


def _summary_table(job: dict[str, Any], state: _FollowState) -> Any:
    from rich.table import Table

    table = Table(title=f"job {job.get('id')}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    started, finished = job.get("created_at"), job.get("finished_at")
    rows = [
        ("status", job.get("status")),
        ("steps", f"{state.step}/{state.total}" if state.total else str(state.step)),
        ("final train loss", _num(state.train_loss)),
        ("final val loss", _num(state.val_loss)),
        ("trained tokens", f"{job['trained_tokens']:,}" if isinstance(job.get("trained_tokens"), int) else "-"),
        ("model", job.get("fine_tuned_model") or "-"),
        ("wall time", _duration(finished - started) if isinstance(finished, int | float)
         and isinstance(started, int | float) else "-"),
    ]
    err = job.get("error") or {}
    if err.get("message"):
        rows.append(("error", f"{err['message']} [{err.get('code') or '-'}]"))
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def cmd_jobs_follow(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return follow_job(client, args.id, json_summary=args.json)


# -- models ------------------------------------------------------------------------------------
def cmd_models_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    with _client(args) as client:
        page = client.list_models()
    if args.json:
        _print_json(page)
        return EXIT_OK
    models = page.get("data", [])
    table = Table("Created", "Owned by")
    _id_column(table, models)
    for m in models:
        table.add_row(m.get("id", "?"), _when(m.get("created")), m.get("owned_by", "-"))
    _console().print(table)
    return EXIT_OK


def cmd_models_download(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    out_arg = Path(args.output) if args.output else None
    tmp: Path | None = None
    fh: Any = None
    final: Path | None = None
    with _client(args) as client, Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=_console(stderr=True),
    ) as bar:
        task = bar.add_task(f"{args.id} ({args.format})", total=None)

        def on_start(total: int | None, filename: str | None) -> None:
            nonlocal tmp, fh, final
            default_name = filename or f"{args.id.replace(':', '_')}.{_default_ext(args.format)}"
            if out_arg is None:
                final = Path(default_name)
            elif out_arg.is_dir():
                final = out_arg / default_name
            else:
                final = out_arg
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.part-{os.getpid()}")
            fh = tmp.open("wb")
            bar.update(task, total=total)

        try:
            client.download_model(args.id, args.format, write=lambda b: fh.write(b), on_start=on_start,
                                  progress=lambda n: bar.advance(task, n))
            fh.close()
            os.replace(tmp, final)  # the file appears whole or not at all
        finally:
            if fh is not None and not fh.closed:
                fh.close()
            if tmp is not None and tmp.exists():
                tmp.unlink()
    size = final.stat().st_size
    print(f"saved {final} ({_size(size)})", file=sys.stderr)
    print(final)
    return EXIT_OK


def _default_ext(fmt: str) -> str:
    return {"gguf": "gguf", "onnx": "onnx", "hf": "tar", "checkpoint": "tar"}[fmt]


# -- registration ------------------------------------------------------------------------------
def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("server")
    # SUPPRESS: given at either level (`jobs --server X list` or `jobs list --server X`) it sticks.
    group.add_argument("--server", default=argparse.SUPPRESS,
                       help="server URL (env FROMSCRATCH_SERVER, default http://127.0.0.1:8000)")
    group.add_argument("--api-key", default=argparse.SUPPRESS, help="API key (env FROMSCRATCH_API_KEY)")
    return common


def register(subparsers: argparse._SubParsersAction) -> None:
    common = _connection_options()

    def leaf(group: argparse._SubParsersAction, name: str, help_text: str,
             handler: Callable[[argparse.Namespace], int], json_flag: bool = False) -> argparse.ArgumentParser:
        p = group.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=_run(handler))
        if json_flag:
            p.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
        return p

    # files
    files = subparsers.add_parser("files", help="upload and list training files on a server", parents=[common])
    files_sub = files.add_subparsers(dest="files_command", metavar="COMMAND", required=True)
    p = leaf(files_sub, "upload", "upload a training file (UTF-8 text or JSONL); prints its id", cmd_files_upload,
             json_flag=True)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--purpose", default="fine-tune", help="file purpose")
    leaf(files_sub, "list", "list your uploaded files", cmd_files_list, json_flag=True)

    # jobs
    jobs = subparsers.add_parser("jobs", help="create, follow and control training jobs on a server",
                                 parents=[common])
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True)
    p = leaf(jobs_sub, "create", "start a training job; prints its id", cmd_jobs_create, json_flag=True)
    p.add_argument("--file", required=True, metavar="FILE_ID", help="training file id (files upload prints it)")
    p.add_argument("--model", default="llama-tiny", metavar="PRESET",
                   help=f"a preset ({', '.join(PRESETS)}) or the id of a model you trained (continue training)")
    p.add_argument("--validation-file", metavar="FILE_ID", help="validation file id")
    p.add_argument("--suffix", help="added to the fine-tuned model's name")
    p.add_argument("--seed", type=int, help="random seed (default: the trainer's, 1337)")
    p.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="job metadata (repeatable)")
    p.add_argument("--idempotency-key", help="a retried create with the same key returns the same job")
    p.add_argument("--follow", action="store_true", help="follow the job after creating it (as jobs follow)")
    _add_hyperparameter_options(p)
    p = leaf(jobs_sub, "list", "list your jobs, newest first", cmd_jobs_list, json_flag=True)
    p.add_argument("--after", metavar="JOB_ID", help="the page after this job id")
    p.add_argument("--limit", type=int, default=20, help="jobs per page")
    p = leaf(jobs_sub, "show", "show one job", cmd_jobs_show, json_flag=True)
    p.add_argument("id", metavar="JOB_ID")
    p = leaf(jobs_sub, "follow", "follow a job live until it ends (exit 1 failed, 3 cancelled)",
             cmd_jobs_follow, json_flag=True)
    p.add_argument("id", metavar="JOB_ID")
    for action, text in (("cancel", "cancel a job"), ("pause", "pause a running job (keeps a checkpoint)"),
                         ("resume", "resume a paused job from its checkpoint")):
        p = leaf(jobs_sub, action, text, cmd_jobs_action, json_flag=True)
        p.add_argument("id", metavar="JOB_ID")
        p.set_defaults(action=action)

    # models
    models = subparsers.add_parser("models", help="list and download trained models from a server",
                                   parents=[common])
    models_sub = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    leaf(models_sub, "list", "list your models (finished jobs and their checkpoints)", cmd_models_list,
         json_flag=True)
    p = leaf(models_sub, "download", "download a model as GGUF, Hugging Face, ONNX or a checkpoint",
             cmd_models_download)
    p.add_argument("id", metavar="MODEL_ID")
    p.add_argument("--format", choices=FORMATS, default="gguf", help="gguf (default), hf, onnx or checkpoint")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="file or folder to write (default: the server's file name in the current folder)")
