"""Completions through the inference workers. Torch-free: the API process never loads a model.

`start_inference` inserts an `inference_requests` row (the owner, the model id, its checkpoint blob,
the params the worker reads), commits, sends its id to the `inference` queue
(core.broker.send_to_inference_worker) and waits until a worker has taken it (`queued` ->
`running`). No worker within `inference_wait_seconds`: the row is deleted (only while still
`queued`, so a worker that took it that instant keeps it) and the answer is 503
`no_inference_worker`. The broker unreachable: the row is deleted, 503 `broker_unavailable`.

No worker took it but one is alive: 503 `inference_workers_busy` with Retry-After instead
(api/inference_liveness.py).

`InferenceRun.deltas()` then polls the row every POLL_SECONDS (each read is a short query in a
thread, never on the event loop) and yields what the worker appended to `output` (final text: the
worker holds back what a stop sequence could still take), and None after each `keepalive` seconds
with nothing to yield (the stream sends a `: keep-alive` comment); when the row is `done` it sets
`result` (finish reason, token counts). `failed` is a 500 `inference_failed` with the worker's
message; `unavailable` (the worker could not read the model's weights: the blob store is down) is
a 503 `storage_unavailable` with Retry-After, the answer an upload or a download gets in an outage
(api/store_errors.py); a worker whose heartbeat stopped for inference_lease_seconds is a 503
`inference_worker_lost` naming it (api/inference_liveness.py). `close()` deletes the row, whatever happened: at the end, on an error, when the client
went away (the route checks `request.is_disconnected()` between polls); a worker still generating
notices the missing row at its next write and stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
from fastapi import FastAPI
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.errors import APIError, quote_input
from api.inference_liveness import HeartbeatWatch, busy, workers_alive
from api.queries import owned_model
from api.quotas import check_completions
from api.store_errors import RETRY_AFTER_SECONDS as STORE_RETRY_AFTER_SECONDS
from core.models import InferenceRequest
from core.settings import Settings

log = logging.getLogger("fromscratch.api")

POLL_SECONDS = 0.05
# past inference_wait_seconds + max_inference_seconds, a worker that took the request died with it
RESULT_GRACE_SECONDS = 30.0
WORKER_HINT = "start one with `fromscratch worker --queues inference` (`fromscratch serve` runs one)"
WEIGHTS_UNAVAILABLE_MESSAGE = (
    "The model's weights could not be loaded: the file store is temporarily unavailable. "
    "Retry the request in a few seconds."
)


@dataclass(frozen=True)
class InferenceResult:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class RowState:
    status: str
    new_output: str  # what was appended to `output` after the characters already relayed
    new_lengths: str  # what was appended to `piece_lengths` after what was already read
    new_logprobs: str  # what was appended to `token_logprobs` after what was already read
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None
    worker: str | None = None  # who runs it, and its last heartbeat
    heartbeat_at: datetime | None = None


def split_pieces(output: str, lengths: str) -> list[str]:
    """`output` cut into the pieces the worker appended it in (`lengths` like "3,1,2,", written in
    the same UPDATE as the text, so both always cover the same pieces)."""
    pieces, start = [], 0
    for n in (int(x) for x in lengths.split(",") if x):
        pieces.append(output[start : start + n])
        start += n
    if start < len(output):  # defensive: text without a recorded length is still relayed
        pieces.append(output[start:])
    return pieces


Disconnected = Callable[[], Awaitable[bool]]  # Request.is_disconnected


class ClientGone(Exception):
    """The client disconnected while its completion was being generated."""


class InferenceRun:
    def __init__(self, app: FastAPI, row_id: str) -> None:
        self.factory: sessionmaker[Session] = app.state.session_factory
        self.settings: Settings = app.state.settings
        self.id = row_id
        self.relayed = 0  # characters of `output` yielded so far
        self.lengths_read = 0  # characters of `piece_lengths` read so far
        self.logprobs_read = 0  # characters of `token_logprobs` read so far
        self.unattached: list[dict[str, Any]] = []  # token records read, their text not yet yielded
        self.attached: list[dict[str, Any]] = []  # token records of the text yielded, not yet taken
        self.result: InferenceResult | None = None
        self.started = time.monotonic()
        self.closed = False
        self.watch = HeartbeatWatch(self.settings.inference_lease_seconds)

    # ------------------------------------------------------------------------------ waiting
    async def wait_taken(self) -> None:
        """Until a worker took the row; 503 `no_inference_worker` after inference_wait_seconds."""
        deadline = self.started + self.settings.inference_wait_seconds
        while True:
            status = await run_in_threadpool(self._status)
            if status != "queued":
                return
            if time.monotonic() >= deadline:
                if await run_in_threadpool(self._withdraw_queued):
                    wait = self.settings.inference_wait_seconds
                    workers, running = await run_in_threadpool(self._alive)
                    if workers or running:
                        raise busy(workers, running, wait)
                    raise APIError(
                        503,
                        f"No inference worker took the request within {wait:g} s "
                        f"(inference_wait_seconds): {WORKER_HINT}.",
                        code="no_inference_worker",
                        # the request already waited inference_wait_seconds: an SDK retrying it
                        # (twice, by default) would keep its caller waiting minutes for the same answer
                        retry=False,
                    )
                return  # taken in the meantime
            await asyncio.sleep(POLL_SECONDS)

    async def deltas(
        self, is_disconnected: Disconnected | None = None, keepalive: float | None = None
    ) -> AsyncIterator[str | None]:
        """The text the worker appends, as it comes; sets `result` when done. `is_disconnected`
        (an async callable) is asked between polls: a client gone raises ClientGone. With
        `keepalive`, None comes after each `keepalive` seconds without text."""
        settings = self.settings
        last_yield = time.monotonic()
        deadline = (
            self.started
            + settings.inference_wait_seconds
            + settings.max_inference_seconds
            + RESULT_GRACE_SECONDS
        )
        while True:
            state = await run_in_threadpool(self._read)
            if state is None:
                raise APIError(
                    500, "The completion was withdrawn before it finished.", code="inference_failed"
                )
            self.unattached += [json.loads(line) for line in state.new_logprobs.splitlines() if line]
            self.logprobs_read += len(state.new_logprobs)
            for piece in split_pieces(state.new_output, state.new_lengths):
                self.relayed += len(piece)
                self._attach()
                last_yield = time.monotonic()
                yield piece
            self.lengths_read += len(state.new_lengths)
            self.watch.seen(state.worker, state.heartbeat_at)
            if state.status == "done":
                self._attach(everything=True)
                self.result = InferenceResult(
                    state.finish_reason or "stop", state.prompt_tokens, state.completion_tokens
                )
                return
            if state.status in ("failed", "unavailable", "invalid"):
                raise _ended_without_text(state)
            if time.monotonic() >= deadline:
                raise APIError(
                    503,
                    "The inference worker stopped answering (it may have been restarted); try again.",
                    code="inference_worker_lost",
                )
            if (lost := self.watch.lost()) is not None:
                raise lost
            if keepalive is not None and time.monotonic() - last_yield >= keepalive:
                last_yield = time.monotonic()
                yield None
            if is_disconnected is not None and await is_disconnected():
                raise ClientGone(self.id)
            await asyncio.sleep(POLL_SECONDS)

    def _attach(self, everything: bool = False) -> None:
        """The token records whose text ends within what was yielded go with it (all at the end).
        A token with no text of its own (a character's leading bytes, which the token completing it
        decodes) sits where its character begins: at the end of what was yielded it goes with the
        next piece, which holds that character."""
        n = len(self.unattached)
        if not everything:
            n = next((i for i, r in enumerate(self.unattached) if self._after_yielded(r)), n)
        self.attached += self.unattached[:n]
        del self.unattached[:n]

    def _after_yielded(self, record: dict[str, Any]) -> bool:
        return record["e"] > self.relayed or record["o"] == record["e"] == self.relayed

    def take_tokens(self) -> list[dict[str, Any]]:
        """The token records (worker/token_logprobs.py) of the text yielded since the last call:
        after a piece, its tokens; after the end, the rest."""
        taken, self.attached = self.attached, []
        return taken

    async def close(self) -> None:
        """Delete the row (also while the request is being cancelled: shielded)."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            await run_in_threadpool(self._delete)

    # ------------------------------------------------------------------------- database (threads)
    def _status(self) -> str | None:
        with self.factory() as session:
            return session.scalar(select(InferenceRequest.status).where(InferenceRequest.id == self.id))

    def _read(self) -> RowState | None:
        with self.factory() as session:
            row = session.execute(
                select(
                    InferenceRequest.status,
                    func.substr(InferenceRequest.output, self.relayed + 1),
                    func.substr(InferenceRequest.piece_lengths, self.lengths_read + 1),
                    func.substr(InferenceRequest.token_logprobs, self.logprobs_read + 1),
                    InferenceRequest.finish_reason,
                    InferenceRequest.prompt_tokens,
                    InferenceRequest.completion_tokens,
                    InferenceRequest.error,
                    InferenceRequest.worker,
                    InferenceRequest.heartbeat_at,
                ).where(InferenceRequest.id == self.id)
            ).one_or_none()
        if row is None:
            return None
        return RowState(row[0], row[1] or "", row[2] or "", row[3] or "", *row[4:])

    def _alive(self) -> tuple[int, int]:
        with self.factory() as session:
            return workers_alive(session, self.settings)

    def _withdraw_queued(self) -> bool:
        with self.factory() as session:
            result = session.execute(
                delete(InferenceRequest).where(
                    InferenceRequest.id == self.id, InferenceRequest.status == "queued"
                )
            )
            session.commit()
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def _delete(self) -> None:
        with self.factory() as session:
            session.execute(delete(InferenceRequest).where(InferenceRequest.id == self.id))
            session.commit()


def _ended_without_text(state: RowState) -> APIError:
    """The error of a request the worker gave up on: the blob store down (an outage: 503), a request
    it could not serve as asked (`invalid`: an echoed prompt to score past the model's context, a 400
    naming `prompt`), or a fault."""
    if state.status == "invalid":
        return APIError(400, state.error or "invalid request", param="prompt", code="context_length_exceeded")
    if state.status == "unavailable":
        log.warning("completion answered 503: the inference worker met a blob store outage (%s)", state.error)
        return APIError(
            503,
            WEIGHTS_UNAVAILABLE_MESSAGE,
            code="storage_unavailable",
            headers={"Retry-After": str(STORE_RETRY_AFTER_SECONDS)},
        )
    return APIError(
        500,
        f"The inference worker could not complete the request: {quote_input(state.error, 500)}",
        code="inference_failed",
    )


def _insert(
    factory: sessionmaker[Session], owner_id: str, model_id: str, params: dict[str, Any], settings: Settings
) -> str:
    with factory() as session:
        ref = owned_model(session, owner_id, model_id)
        if ref.checkpoint is None:
            raise APIError(
                404,
                f"Model {quote_input(model_id)} has no stored weights.",
                param="model",
                code="model_not_found",
            )
        _check_token_ids(params, int(ref.job.model_config.get("vocab_size", 0)))
        check_completions(session, owner_id, settings.max_completions_per_key)
        row = InferenceRequest(
            owner_id=owner_id, model_id=ref.id, blob_id=ref.checkpoint.blob_id, params=params
        )
        session.add(row)
        session.commit()
        return row.id


def _check_token_ids(params: dict[str, Any], vocab_size: int) -> None:
    """A prompt's token ids and logit_bias's name tokens of this model's vocabulary: 400 before a
    worker loads the model."""
    prompt = params.get("prompt")
    for param, tokens in (
        ("prompt", prompt if isinstance(prompt, list) else []),
        ("logit_bias", [int(token) for token in params.get("logit_bias") or {}]),
    ):
        outside = sorted(token for token in tokens if token >= vocab_size)
        if outside:
            raise APIError(
                400,
                f"{param}: token id {outside[0]} is not in this model's vocabulary "
                f"(ids 0 to {vocab_size - 1})",
                param=param,
                code="invalid_value",
            )


def _send(app: FastAPI, row_id: str) -> None:
    from core.broker import INFERENCE_TASK, send_to_inference_worker

    send_to_inference_worker(app.state.celery, INFERENCE_TASK, row_id)


async def start_inference(app: FastAPI, owner_id: str, model_id: str, params: dict[str, Any]) -> InferenceRun:
    """Insert the request, send it and wait until a worker took it (see the module docstring)."""
    row_id = await run_in_threadpool(
        _insert, app.state.session_factory, owner_id, model_id, params, app.state.settings
    )
    run = InferenceRun(app, row_id)
    try:
        try:
            await run_in_threadpool(_send, app, row_id)
        except Exception as e:  # any broker failure
            log.warning("could not send inference request %s: %s", row_id, e)
            raise APIError(
                503,
                "The request could not be sent to an inference worker: the broker is unreachable. "
                "Try again later (GET /readyz shows when the service is ready).",
                code="broker_unavailable",
            ) from e
        await run.wait_taken()
    except BaseException:
        await run.close()
        raise
    return run


async def collect(
    run: InferenceRun, is_disconnected: Disconnected | None = None
) -> tuple[str, InferenceResult]:
    """The whole completion (the row is deleted afterwards)."""
    parts: list[str] = []
    try:
        async for delta in run.deltas(is_disconnected):
            if delta is not None:
                parts.append(delta)
    finally:
        await run.close()
    assert run.result is not None
    return "".join(parts), run.result
