"""Running one client command: exit codes, usage errors, the connection to the server, and the
wrapper that turns errors into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from client.http import Client

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

Handler = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A mistake in how the command was called (exit code 2)."""


class CommandError(Exception):
    """The command could not finish what it was asked (one line on stderr, exit code 1)."""


def connect(args: argparse.Namespace) -> Client:
    """A client.http.Client for `--server`/`--api-key` (or their environment variables)."""
    from client.http import DEFAULT_SERVER, Client

    server = getattr(args, "server", None) or os.environ.get("FROMSCRATCH_SERVER") or DEFAULT_SERVER
    api_key = getattr(args, "api_key", None) or os.environ.get("FROMSCRATCH_API_KEY")
    if not api_key:
        raise UsageError(
            "no API key: pass --api-key or set FROMSCRATCH_API_KEY "
            "(`fromscratch keys create --name NAME` makes one)"
        )
    return Client(server, api_key)


def run_command(handler: Handler) -> Handler:
    """Wrap a command: API errors become one line on stderr and exit 1; usage errors exit 2."""
    from client.http import APIError

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except UsageError as e:
            print(f"fromscratch: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except APIError as e:
            print(f"fromscratch: error: {e.one_line()}", file=sys.stderr)
            return EXIT_ERROR
        except CommandError as e:
            print(f"fromscratch: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print("fromscratch: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run
