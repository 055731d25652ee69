"""`fromscratch sample`: a checkpoint's continuation of a prompt, or a chat with it (`--chat`), printed
as it is generated.

The text comes out as the inference worker publishes it (trainer.text_stream.TextStream): whole
UTF-8 characters, a stop sequence (`--stop`) cut off where it begins. A chat renders the conversation
with the service's chat format (trainer.data.chat: the template chat JSONL trains on) and each reply
ends where the model begins the next message or at EOS, as `/v1/chat/completions` ends it. With
`--prompt`, a chat is that one user message; otherwise each line read from stdin is the next one, and
the conversation so far is the next reply's context (the model's own context keeps its newest part).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data.chat import CHAT_STOP, chat_prompt
from trainer.text_stream import TextStream

if TYPE_CHECKING:
    from trainer.data.tokenizers import Tokenizer
    from trainer.model.llama import Llama

CKPT_HELP = "checkpoint folder (e.g. OUT/final), or a run folder OUT (its model, OUT/final)"
INTERRUPTED = 130  # the exit status of a command Ctrl-C stopped (128 + SIGINT), as a shell reports it


def model_folder_of(ckpt: Path) -> Path:
    """CKPT, or the model of the run folder it names (said on stderr)."""
    from trainer.checkpoint import model_folder

    folder = model_folder(ckpt)
    if folder != ckpt:
        print(f"using {folder}", file=sys.stderr)
    return folder


def stream_text(
    model: Llama, tokenizer: Tokenizer, prompt: str, stops: Sequence[str], trailing: str, **sampling: Any
) -> Iterator[str]:
    """The continuation of `prompt` as final pieces of text, ending at EOS, max_new_tokens or the first
    stop sequence (left out); `trailing` is dropped when generation ends (a chat reply's newline)."""
    from trainer.sampling import stream_ids

    ids = tokenizer.encode(prompt) if prompt else [tokenizer.bos_id]
    text = TextStream(stops, trailing)
    tokens = stream_ids(model, ids, eos_id=tokenizer.eos_id, **sampling)
    try:
        for token in tokens:
            if piece := text.push(tokenizer.token_bytes(token)):
                yield piece
            if text.stopped:
                return
    finally:
        tokens.close()
    if rest := text.finish():
        yield rest


def add_sample_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sample",
        help="generate text from a checkpoint, or chat with it",
        description="Print the prompt followed by a generated continuation, as it is generated; with "
        "--chat, the replies of a conversation in the service's chat format.",
    )
    p.add_argument("ckpt", metavar="CKPT", type=Path, help=CKPT_HELP)
    p.add_argument(
        "--prompt",
        default="",
        metavar="TEXT",
        help="prompt text (default: empty = start from BOS); with --chat, the one user message",
    )
    _add_sampling_options(p)
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="SEQ",
        help="end the text where SEQ begins (SEQ left out); may be given several times",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="chat: each line on stdin (or --prompt) is a user message, each reply is printed",
    )
    p.add_argument("--system", default=None, metavar="TEXT", help="with --chat: a system message first")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="(default: cpu)")
    p.set_defaults(func=cmd_sample, _parser=p)


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=200,
        metavar="N",
        help="tokens to generate (a chat: per reply) (default: 200)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        metavar="T",
        help="sampling temperature; 0 = greedy (default: 0.8)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        metavar="K",
        help="sample from the K likeliest tokens (default: off)",
    )
    p.add_argument(
        "--top-p", type=float, default=None, metavar="P", help="nucleus sampling mass (default: off)"
    )
    p.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (default: random)")
    for name, what in (("frequency", "per time it was generated"), ("presence", "once it was generated")):
        p.add_argument(
            f"--{name}-penalty",
            type=float,
            default=0.0,
            metavar="X",
            help=f"subtract X from a token's logit {what}, as OpenAI's {name}_penalty (default: 0)",
        )


def cmd_sample(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args._parser
    _check_options(parser, args)
    from trainer.checkpoint import CheckpointError, load_model

    try:
        model, tokenizer = load_model(model_folder_of(args.ckpt), device=args.device)
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(f"CKPT: {err}")
    from trainer.sampling import Penalties

    sampling = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        penalties=Penalties(frequency=args.frequency_penalty, presence=args.presence_penalty),
    )
    if args.chat:  # Ctrl-C ends either (cli.main: "interrupted", INTERRUPTED)
        chat(model, tokenizer, _user_lines(args.prompt), args.stop, args.system, args.seed, **sampling)
    else:
        _show(args.prompt)
        for piece in stream_text(model, tokenizer, args.prompt, args.stop, "", seed=args.seed, **sampling):
            _show(piece)
        print()
    return 0


# a model's text may hold control characters (ESC, BS, CR...): on a terminal they would move the
# cursor, recolour or erase what is shown, so they are shown as their control pictures (ESC as ␛);
# piped output keeps the exact text
_CONTROLS = {c: chr(0x2400 + c) for c in range(32) if chr(c) not in "\n\t"} | {0x7F: "\u2421"}
_CONTROLS |= {c: "\ufffd" for c in range(0x80, 0xA0)}  # C1 controls: some terminals obey them too


def _show(piece: str) -> None:
    print(piece.translate(_CONTROLS) if sys.stdout.isatty() else piece, end="", flush=True)


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.max_new_tokens < 0:
        parser.error(f"--max-new-tokens: must be >= 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        parser.error(f"--temperature: must be >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k <= 0:
        parser.error(f"--top-k: must be positive, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        parser.error(f"--top-p: must be in (0, 1], got {args.top_p}")
    if "" in args.stop:
        parser.error("--stop: must not be empty")
    if args.system is not None and not args.chat:
        parser.error("--system: only with --chat")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device: cuda was asked for but no CUDA device is available; use cpu")


def chat(
    model: Llama,
    tokenizer: Tokenizer,
    user_messages: Iterable[str],
    stops: Sequence[str],
    system: str | None,
    seed: int | None,
    **sampling: Any,
) -> list[dict[str, str]]:
    """Print a reply to each user message, the conversation so far as its context; returns the
    conversation. Turn i samples with seed + i, so a seeded chat replays the same."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    for turn, message in enumerate(user_messages):
        messages.append({"role": "user", "content": message})
        reply = []
        at = None if seed is None else seed + turn
        prompt = chat_prompt(messages)
        for piece in stream_text(model, tokenizer, prompt, [*stops, CHAT_STOP], "\n", seed=at, **sampling):
            _show(piece)
            reply.append(piece)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
    return messages


def _user_lines(prompt: str) -> Iterator[str]:
    """--prompt as the one message, else stdin's lines (a terminal gets a "> " prompt on stderr)."""
    if prompt:
        yield prompt
        return
    interactive = sys.stdin.isatty()
    if interactive:
        print("Each line you type is a message; Ctrl-D ends the chat.", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line.rstrip("\n")
