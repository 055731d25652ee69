"""The worker subprocesses `fromscratch serve` keeps alive beside its API (one supervisor each)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

WORKER_STOP_TIMEOUT = 60.0  # seconds the worker gets to checkpoint and exit before SIGKILL
RESTART_BACKOFF_MAX = 30.0
HEALTHY_RUN_SECONDS = 60.0  # a worker that ran this long resets the restart backoff


class WorkerSupervisor(threading.Thread):
    """Keeps one worker subprocess running: restarts it (1 s, 2 s, ... up to 30 s apart) when it
    dies, and stops it with SIGTERM (then SIGKILL after a timeout) on `stop()`."""

    def __init__(self, cmd: list[str], env: dict[str, str], name: str = "worker"):
        super().__init__(name=f"supervisor of {name}", daemon=True)
        self.label = name
        self.cmd, self.env = cmd, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.restarts = 0
        self._lock = threading.Lock()

    def _spawn(self) -> None:
        with self._lock:
            if self.stopping.is_set():
                return
            # its own session: a terminal's Ctrl-C reaches only `serve`, which then stops the worker
            self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True)

    def run(self) -> None:
        backoff = 1.0
        while not self.stopping.is_set():
            started = time.monotonic()
            self._spawn()
            proc = self.proc
            if proc is None:
                return
            while proc.poll() is None and not self.stopping.is_set():
                self.stopping.wait(0.5)
            if self.stopping.is_set():
                return
            if time.monotonic() - started >= HEALTHY_RUN_SECONDS:
                backoff = 1.0
            print(
                f"fromscratch serve: the {self.label} exited with code {proc.returncode}; restarting it in "
                f"{backoff:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            self.restarts += 1
            if self.stopping.wait(backoff):
                return
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX)

    def request_stop(self) -> None:
        """SIGTERM the worker without waiting (stop() then waits)."""
        with self._lock:
            self.stopping.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> None:
        with self._lock:
            already = self.stopping.is_set()
            self.stopping.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            if not already:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(
                    f"fromscratch serve: the {self.label} did not stop in time; killing it", file=sys.stderr
                )
                proc.kill()
                proc.wait()
        self.join(timeout=5)
