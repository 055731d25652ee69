"""Callbacks that live in the launching process while rank 0 of a distributed run calls them.

`trainer.distributed.launch.launch_train` calls its callbacks in rank 0, a process of its own. A caller
whose callbacks hold state of its process (a database session, a lease heartbeat, a shutdown flag:
the worker's) serves them with `CallbackRelay` and hands the ranks `relay.factory`, a picklable
`RelayedCallbacks`: each hook that rank 0 calls is sent over a Unix socket (authenticated with a
random key, owner-only folder) and run here, in order, on the relay's thread; its result or the
fact that it raised goes back. What crosses the socket is our own processes' pickles, never a
user's data.

    with CallbackRelay(service_callbacks) as relay:
        try:
            result = launch_train(..., callbacks_factory=relay.factory)
        except BaseException:
            relay.raise_error()  # the callbacks' own exception (e.g. the database went away), if any
            raise
"""

from __future__ import annotations

import secrets
import signal
import tempfile
import threading
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from trainer.config.metrics import EvalMetrics, FullEvalMetrics, StepMetrics
from trainer.run.report import Callbacks
from trainer.run.state import StartInfo

HOOKS = frozenset({"on_start", "on_step", "on_eval", "on_full_eval", "on_checkpoint", "should_stop"})


class RelayedCallbackError(RuntimeError):
    """Raised in rank 0 when a relayed hook raised in the launching process (which keeps the
    original exception: CallbackRelay.raise_error)."""


@dataclass(frozen=True)
class RelayedCallbacks:
    """The callbacks factory the ranks receive (picklable): rank 0 calls it once."""

    address: str
    authkey: bytes

    def __call__(self) -> Callbacks:
        # Ctrl-C reaches every process of a terminal: the launching process decides about stopping
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return _RemoteCallbacks(Client(self.address, family="AF_UNIX", authkey=self.authkey))


class _RemoteCallbacks(Callbacks):
    def __init__(self, conn: Connection):
        self._conn = conn

    def _call(self, hook: str, *args: Any) -> Any:
        self._conn.send((hook, args))
        ok, value = self._conn.recv()
        if not ok:
            raise RelayedCallbackError(value)
        return value

    def on_start(self, info: StartInfo) -> None:
        self._call("on_start", info)

    def on_step(self, metrics: StepMetrics) -> None:
        self._call("on_step", metrics)

    def on_eval(self, metrics: EvalMetrics) -> None:
        self._call("on_eval", metrics)

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        self._call("on_full_eval", metrics)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self._call("on_checkpoint", step, path)

    def on_note(self, message: str) -> None:
        self._call("on_note", message)

    def should_stop(self) -> Literal["stop", "pause"] | None:
        answer: Literal["stop", "pause"] | None = self._call("should_stop")
        return answer


class CallbackRelay:
    """Serves `callbacks` to rank 0 for the length of a `with` block (see the module docstring)."""

    def __init__(self, callbacks: Callbacks):
        self.callbacks = callbacks
        self.error: BaseException | None = None  # the first exception a hook raised
        self._folder = tempfile.TemporaryDirectory(prefix="fromscratch-relay-")  # mode 0700
        authkey = secrets.token_bytes(32)
        address = str(Path(self._folder.name) / "callbacks.sock")
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        self.factory = RelayedCallbacks(address, authkey)
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="callback-relay", daemon=True)

    def __enter__(self) -> CallbackRelay:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing = True
        try:  # accept() does not return when another thread closes its socket: connect to end it
            Client(self.factory.address, family="AF_UNIX", authkey=self.factory.authkey).close()
        except OSError:
            pass
        self._thread.join(timeout=10)
        self._listener.close()
        self._folder.cleanup()

    def raise_error(self) -> None:
        """Raise the exception a hook raised here, if one did (rank 0 only saw its message)."""
        if self.error is not None:
            raise self.error

    def _serve(self) -> None:
        while not self._closing:
            try:
                conn = self._listener.accept()
            except (OSError, AuthenticationError):  # a caller without the key
                continue
            if self._closing:
                conn.close()
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: Connection) -> None:
        """Run rank 0's calls until it hangs up (it finished, or it died)."""
        while True:
            try:
                hook, args = conn.recv()
            except (EOFError, OSError):
                return
            if hook not in HOOKS:
                conn.send((False, f"unknown callback {hook!r}"))
                continue
            try:
                reply = (True, getattr(self.callbacks, hook)(*args))
            except BaseException as err:
                if self.error is None:
                    self.error = err
                reply = (False, f"{type(err).__name__}: {err}")
            try:
                conn.send(reply)
            except OSError:
                return
