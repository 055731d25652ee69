"""`fromscratch models complete MODEL_ID PROMPT`: a completion from a model on the server, printed as
it streams (OpenAI's `/v1/completions`; `--chat`: the prompt as one user message to
`/v1/chat/completions`). The text goes to stdout, the usage and finish reason to stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from client.commands.runner import EXIT_OK, CommandError, connect


def completion_body(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The endpoint and the request body the options make."""
    body: dict[str, Any] = {"model": args.id, "max_tokens": args.max_tokens}
    for name in ("temperature", "top_p", "seed"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if args.stop:
        body["stop"] = args.stop
    if args.chat:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": args.prompt}]}
    return "/v1/completions", {**body, "prompt": args.prompt}


def _delta(chunk: dict[str, Any], chat: bool) -> tuple[str, str | None]:
    """A chunk's text and finish reason (none in the last chunk, which carries the usage)."""
    if "error" in chunk:  # the stream's error event: the request failed after it began
        raise CommandError(str(chunk["error"].get("message", chunk["error"])))
    if not chunk.get("choices"):
        return "", None
    choice = chunk["choices"][0]
    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
    return text or "", choice.get("finish_reason")


def cmd_models_complete(args: argparse.Namespace) -> int:
    """Stream the completion to stdout as it is generated."""
    path, body = completion_body(args)
    finish, usage = None, None
    with connect(args) as client:
        for chunk in client.stream_completion(path, body):
            text, finished = _delta(chunk, args.chat)
            sys.stdout.write(text)
            sys.stdout.flush()
            finish = finished or finish
            usage = chunk.get("usage") or usage
    sys.stdout.write("\n")
    if usage is not None:
        print(
            f"[{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens, "
            f"finish_reason {finish}]",
            file=sys.stderr,
        )
    return EXIT_OK
