"""`fromscratch` entry point. Each part registers its own subcommands; modules are imported lazily
so `fromscratch train` does not pay for (or need) the service stack."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from cli.parser import Parser
from trainer.sample_cli import INTERRUPTED

# subcommand -> module providing register(subparsers) for it (several may share a module)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("trainer.cli", "train a llama from scratch on a text/JSONL file"),
    "sample": ("trainer.cli", "generate text from a checkpoint"),
    "export": ("trainer.cli", "export a checkpoint as GGUF, Hugging Face or ONNX"),
    "serve": ("cli.serve", "run the API, dashboard and one worker (embedded SQLite defaults)"),
    "migrate": ("cli.migrate", "apply database migrations (alembic upgrade head)"),
    "keys": ("cli.keys", "manage API keys"),
    "worker": ("worker.cli", "run a Celery training worker"),
    "files": ("client.commands", "upload and list training files on a server"),
    "jobs": ("client.commands", "create, follow and control training jobs on a server"),
    "models": ("client.commands", "list and download trained models from a server"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog="fromscratch", description="Train small llamas from scratch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    registered: set[str] = set()
    for name, (module, help_text) in COMMANDS.items():
        if only is not None and module != COMMANDS[only][0]:
            sub.add_parser(name, help=help_text)  # listed in --help without importing its module
            continue
        if module in registered:
            continue
        importlib.import_module(module).register(sub)
        registered.add(module)
    return parser


SIGPIPE_EXIT = 141  # what a shell reports for a command a closed pipe stopped (128 + SIGPIPE)


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand. Output piped into a reader that stops early (`| head`) ends the command
    quietly, as it would a C tool killed by SIGPIPE, not with a traceback; so does Ctrl-C where a
    command has nothing of its own to do about it (train stops with a checkpoint first)."""
    try:
        code = _run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, where a closed pipe can still be caught, not at the interpreter's exit
        return code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # stdout is gone: point it at /dev/null so the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_EXIT


def _run(argv: list[str]) -> int:
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
