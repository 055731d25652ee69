"""One completion, run by an inference worker (`fromscratch worker --queues inference`, a thread pool).

The API inserts an `inference_requests` row (`queued`, its `params`) and sends its id. Here:
1. claim it: `queued -> running` as a conditional UPDATE (a replayed message, or a row the API
   already gave up on and deleted, claims nothing and is dropped), naming this worker in `worker`;
   until it ends, the process's heartbeat thread (core/row_heartbeat.py) refreshes the row's
   `heartbeat_at` every inference_heartbeat_seconds, model loading included: the API reads a
   heartbeat that stops as a dead worker (api/inference_liveness.py);
2. load the model (worker/model_cache.py: an LRU shared by the pool's threads) and render the prompt:
   `params.prompt` as it is, or `params.messages` in the chat template the trainer renders chat
   JSONL with (trainer.data.chat.chat_prompt) followed by the assistant's header `<|assistant|>\\n`;
   the reply then ends where the model starts the next message (`CHAT_STOP`, "\\n<|");
3. generate token by token (trainer.sampling.stream_ids, seeded when `params.seed` is given),
   turning the tokens into final text (trainer/text_stream.py: whole UTF-8 characters only, the
   possible beginning of a stop sequence held back, the stop sequence itself left out) and
   appending it to the row's `output` every FLUSH_SECONDS. An UPDATE that matches no row means
   the API deleted it (its client went away): generation stops there;
4. finish: `done` with `prompt_tokens` (the prompt's tokens; an empty prompt starts from BOS, not
   counted), `completion_tokens` (tokens generated, a stop sequence's and the EOS ended on included) and
   `finish_reason` (`stop`: EOS or a stop sequence; `length`: max_tokens, or max_inference_seconds
   ran out). Any exception: `failed` with the message in `error`; but the blob store unreachable
   while the model is loaded (core.blob_errors.is_store_outage: S3 down, after botocore's own
   retries) is `unavailable`, an outage to wait out, which the API answers 503 `storage_unavailable`
   with Retry-After (api/inference.py), not a 500; the worker logs one line for it, no traceback.

With `params.logprobs` (the likeliest tokens to list, 0 for none) each token's logprobs go to the
row's `token_logprobs` with its text (worker/token_logprobs.py; a legacy completion that ends on
EOS lists it last, with no text, as OpenAI's and vLLM's do); `params.echo` puts the prompt first
in `output` (scored too with logprobs: at most the model's context of it, else the row ends `invalid`,
which the API answers 400 naming `prompt`).

Housekeeping: rows older than the longest an API waits for one (inference_wait_seconds +
max_inference_seconds + STALE_GRACE_SECONDS) are left only by an API process that died mid-request;
the first request a worker process takes every SWEEP_EVERY_SECONDS deletes them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, update
from sqlalchemy.orm import Session, sessionmaker

from core.blob_errors import is_store_outage
from core.db_faults import describe
from core.models import InferenceRequest, utcnow
from core.row_heartbeat import RowHeartbeat
from core.settings import Settings
from trainer.data.chat import CHAT_STOP, chat_prompt
from trainer.text_stream import TextStream
from worker.token_logprobs import PromptTooLong, TokenTracker, lines, prompt_entries

if TYPE_CHECKING:
    from collections.abc import Generator

    from trainer.data.tokenizers import Tokenizer
    from trainer.model.llama import Llama
    from worker.process import Resources

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.1  # how often new text reaches the row (and a deleted row is noticed)
SWEEP_EVERY_SECONDS = 60.0
STALE_GRACE_SECONDS = 60.0


def prompt_and_stops(params: dict[str, Any], tokenizer: Tokenizer) -> tuple[str, list[int], list[str]]:
    """The prompt's text and token ids, and the stop sequences. A prompt given as token ids (the API
    checked them against the vocabulary) is used as given; its text is what they decode to."""
    stops = list(params.get("stop") or [])
    if params.get("messages") is not None:
        text = chat_prompt(params["messages"])
        return text, tokenizer.encode(text), [*stops, CHAT_STOP]
    prompt = params.get("prompt") or ""
    if isinstance(prompt, list):
        ids = [int(token) for token in prompt]
        return tokenizer.decode(ids), ids, stops
    return str(prompt), tokenizer.encode(str(prompt)) if prompt else [], stops


def run_inference(request_id: str, settings: Settings, worker: str = "") -> None:
    """Serve one request; `worker` names this worker in the row (its node name)."""
    from worker.process import resources

    res = resources(settings)
    try:
        sweep_stale_requests(res.session_factory, settings)
    except Exception:  # housekeeping must not cost this request its answer
        log.warning("could not delete stale inference requests", exc_info=True)
    params = claim(res.session_factory, request_id, f"{worker or socket.gethostname()} (pid {os.getpid()})")
    if params is None:
        return
    heartbeat = _heartbeat(res.session_factory, settings.inference_heartbeat_seconds)
    heartbeat.add(request_id)
    try:
        _serve(request_id, params, settings, res)
    finally:
        heartbeat.discard(request_id)


class StoreUnavailable(Exception):
    """The blob store was unreachable while the model's checkpoint was read (an outage)."""


def _serve(request_id: str, params: tuple[str, dict[str, Any]], settings: Settings, res: Resources) -> None:
    started = time.monotonic()
    try:
        blob_id, body = params
        model, tokenizer = _load(blob_id, settings, res)
        outcome = generate_into_row(
            res.session_factory, request_id, model, tokenizer, body, started + settings.max_inference_seconds
        )
    except PromptTooLong as exc:  # the request's fault: a 400 naming `prompt`
        _end_row(res.session_factory, request_id, "invalid", str(exc))
        return
    except StoreUnavailable as exc:  # an outage, not a fault: one line
        log.warning("inference %s: the model could not be loaded: %s", request_id, exc)
        _end_row(res.session_factory, request_id, "unavailable", str(exc))
        return
    except Exception as exc:
        log.warning("inference %s failed", request_id, exc_info=True)
        _end_row(res.session_factory, request_id, "failed", describe_failure(exc))
        return
    log.info("inference %s: %s in %.2fs", request_id, outcome, time.monotonic() - started)


def _end_row(session_factory: sessionmaker[Session], request_id: str, status: str, error: str) -> None:
    """The request ended without its completion: `failed` or `unavailable`, saying why in `error`."""
    with session_factory() as session:
        session.execute(
            update(InferenceRequest)
            .where(InferenceRequest.id == request_id)
            .values(status=status, error=error, updated_at=utcnow())
        )
        session.commit()


def _load(blob_id: str, settings: Settings, res: Resources) -> tuple[Llama, Tokenizer]:
    """The model of checkpoint blob `blob_id` (this process's cache); StoreUnavailable when the blob
    store could not be reached to read it."""
    from worker.model_cache import model_cache

    cache = model_cache(settings.max_loaded_models, settings.inference_device)
    try:
        return cache.get(blob_id, res.store, settings.work_path)
    except Exception as exc:
        if is_store_outage(exc):
            raise StoreUnavailable(f"the blob store is unreachable: {describe(exc)}") from exc
        raise


def describe_failure(exc: BaseException) -> str:
    """`Type: message` of what went wrong, without the SQL and parameters a database error carries."""
    exc = getattr(exc, "orig", None) or exc
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:500]}" if lines else type(exc).__name__


_heartbeats: dict[int, RowHeartbeat] = {}  # per session factory: one thread per process
_heartbeats_lock = threading.Lock()


def _heartbeat(session_factory: sessionmaker[Session], interval: float) -> RowHeartbeat:
    with _heartbeats_lock:
        found = _heartbeats.get(id(session_factory))
        if found is None:
            running = InferenceRequest.status == "running"
            found = RowHeartbeat(session_factory, interval, InferenceRequest, running)
            _heartbeats[id(session_factory)] = found
        return found


def claim(
    session_factory: sessionmaker[Session], request_id: str, worker: str = ""
) -> tuple[str, dict[str, Any]] | None:
    """queued -> running, by `worker`; (blob id, params), or None when the row is gone or taken."""
    with session_factory() as session:
        now = utcnow()
        taken = session.execute(
            update(InferenceRequest)
            .where(InferenceRequest.id == request_id, InferenceRequest.status == "queued")
            .values(status="running", updated_at=now, worker=worker or None, heartbeat_at=now)
            .returning(InferenceRequest.blob_id, InferenceRequest.params)
        ).one_or_none()
        session.commit()
    if taken is None:
        return None
    return str(taken[0]), dict(taken[1])


class RowWriter:
    """Appends final text to the row's `output`, at most every FLUSH_SECONDS."""

    def __init__(self, session_factory: sessionmaker[Session], request_id: str) -> None:
        self.session_factory, self.request_id = session_factory, request_id
        self.buffer = ""
        self.lengths = ""  # "3,1," : the pieces of `buffer`, appended to the row's piece_lengths
        self.logprobs = ""  # JSON lines of tokens' logprobs, appended to the row's token_logprobs
        self.written = 0  # characters of text added so far
        self.last_flush = time.monotonic()

    def add(self, piece: str) -> None:
        """Buffer one piece of final text (what one token made final)."""
        if piece:
            self.buffer += piece
            self.lengths += f"{len(piece)},"
            self.written += len(piece)

    def add_logprobs(self, entries: list[dict[str, Any]]) -> None:
        """Buffer reported tokens (worker/token_logprobs.py), written with the text."""
        self.logprobs += lines(entries)

    def due(self) -> bool:
        return time.monotonic() - self.last_flush >= FLUSH_SECONDS

    def flush(self, **values: Any) -> bool:
        """Write what is buffered (and `values`); False when the row is gone (the API deleted it)."""
        changes: dict[str, Any] = {"updated_at": utcnow(), **values}
        if self.buffer:
            changes["output"] = InferenceRequest.output + self.buffer
            changes["piece_lengths"] = InferenceRequest.piece_lengths + self.lengths
        if self.logprobs:
            changes["token_logprobs"] = InferenceRequest.token_logprobs + self.logprobs
        with self.session_factory() as session:
            result = session.execute(
                update(InferenceRequest)
                .where(InferenceRequest.id == self.request_id, InferenceRequest.status == "running")
                .values(**changes)
            )
            session.commit()
        self.buffer = self.lengths = self.logprobs = ""
        self.last_flush = time.monotonic()
        return bool(result.rowcount)  # type: ignore[attr-defined]


def generate_into_row(
    session_factory: sessionmaker[Session],
    request_id: str,
    model: Llama,
    tokenizer: Tokenizer,
    params: dict[str, Any],
    deadline: float,
) -> str:
    """Generate the completion into the row; returns a line for the log."""
    from trainer.logprobs import LogprobRecorder
    from trainer.sampling import Penalties, context_room, stream_ids

    prompt, prompt_ids, stops = prompt_and_stops(params, tokenizer)
    max_tokens = int(params["max_tokens"])
    if params.get("fill_context"):  # a chat that named no bound: until the context is full
        max_tokens = min(max_tokens, context_room(len(prompt_ids), model.cfg.ctx))
    top = params.get("logprobs")  # None: no logprobs asked for
    writer = RowWriter(session_factory, request_id)
    if params.get("echo"):
        echo_prompt(writer, model, tokenizer, prompt, prompt_ids, top)
    recorder = LogprobRecorder(int(top)) if top is not None else None
    tokens = stream_ids(
        model,
        prompt_ids or [tokenizer.bos_id],
        max_tokens,
        temperature=float(params.get("temperature", 1.0)),
        top_k=params.get("top_k"),
        top_p=params.get("top_p"),
        seed=params.get("seed"),
        eos_id=tokenizer.eos_id,
        penalties=Penalties(
            frequency=float(params.get("frequency_penalty") or 0.0),
            presence=float(params.get("presence_penalty") or 0.0),
            logit_bias={int(k): float(v) for k, v in (params.get("logit_bias") or {}).items()},
        ),
        recorder=recorder,
    )
    chat = params.get("messages") is not None
    # legacy completions list the EOS a completion ends on (lm-evaluation-harness counts on it)
    tracker = (
        None if recorder is None else TokenTracker(tokenizer, writer.written, recorder, report_eos=not chat)
    )
    text = TextStream(stops, trailing="\n" if chat else "")  # a reply ends before the template's "\n"
    return _decode_into(writer, text, tokens, tokenizer, deadline, max_tokens, len(prompt_ids), tracker)


def echo_prompt(
    writer: RowWriter, model: Llama, tokenizer: Tokenizer, prompt: str, ids: list[int], top: int | None
) -> None:
    """echo: the prompt opens the output; with logprobs, its tokens scored in one forward (at most
    the model's context of them: PromptTooLong otherwise, a 400 naming `prompt`)."""
    from trainer.logprobs import score

    if top is not None:
        if len(ids) > model.cfg.ctx:
            raise PromptTooLong(
                f"prompt: its {len(ids)} tokens exceed the model's context of {model.cfg.ctx} tokens; "
                "echo with logprobs scores the whole prompt, so it must fit"
            )
        writer.add_logprobs(prompt_entries(tokenizer, ids, score(model, ids, int(top))))
    writer.add(prompt.replace("\x00", "\ufffd"))


def _decode_into(
    writer: RowWriter,
    text: TextStream,
    tokens: Generator[int, None, None],
    tokenizer: Tokenizer,
    deadline: float,
    max_tokens: int,
    prompt_tokens: int,
    tracker: TokenTracker | None,
) -> str:
    """generate_into_row's loop: tokens -> final text (and their logprobs) in the row."""
    n = 0
    finish_reason = "stop" if max_tokens else "length"  # EOS, unless the loop says otherwise
    try:
        for token in tokens:
            n += 1
            start = text.decoded
            writer.add(text.push(tokenizer.token_bytes(token)))
            if tracker is not None:
                tracker.add(token, start, text.decoded)
                writer.add_logprobs(tracker.ready(text.published))
            if text.stopped:
                break
            if n == max_tokens or time.monotonic() >= deadline:
                finish_reason = "length"
                break
            if writer.due() and not writer.flush(completion_tokens=n):
                return f"stopped after {n} tokens: the request was withdrawn"
        else:
            if max_tokens:  # the tokens ran out: the model picked EOS, which they do not include
                n += 1  # a token generated all the same (counted in usage, as OpenAI's)
                if tracker is not None:
                    tracker.add_eos(text.decoded)
    finally:
        tokens.close()
    writer.add(text.finish(at_eos=finish_reason == "stop"))
    if tracker is not None:
        writer.add_logprobs(tracker.rest(text))
    done = writer.flush(
        status="done", prompt_tokens=prompt_tokens, completion_tokens=n, finish_reason=finish_reason
    )
    if not done:
        return f"{n} tokens, then the request was withdrawn"
    return f"{prompt_tokens} prompt + {n} completion tokens, finish_reason {finish_reason}"


_last_sweep = 0.0
_sweep_lock = threading.Lock()


def sweep_stale_requests(session_factory: sessionmaker[Session], settings: Settings) -> int:
    """Delete the rows an API process that died left behind (at most once per SWEEP_EVERY_SECONDS
    per process); returns how many."""
    global _last_sweep
    with _sweep_lock:
        now = time.monotonic()
        if _last_sweep and now - _last_sweep < SWEEP_EVERY_SECONDS:
            return 0
        _last_sweep = now
    age = settings.inference_wait_seconds + settings.max_inference_seconds + STALE_GRACE_SECONDS
    with session_factory() as session:
        result = session.execute(
            delete(InferenceRequest).where(InferenceRequest.created_at < utcnow() - timedelta(seconds=age))
        )
        session.commit()
    n = int(result.rowcount)  # type: ignore[attr-defined]
    if n:
        log.info("deleted %d inference requests left by an API process that went away", n)
    return n
