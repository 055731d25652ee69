"""Progress display for `fromscratch train`: a rich progress bar on a terminal (step/total, loss,
tokens/s, ETA), plain log lines otherwise (pipes, CI logs). Ctrl-C asks the loop to stop at the
next step boundary, which writes a checkpoint; a second Ctrl-C interrupts at once."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, TextIO, TypeAlias

from trainer.config.metrics import EvalMetrics, FullEvalMetrics, StepMetrics
from trainer.config.throughput import StepRate
from trainer.run.report import Callbacks

if TYPE_CHECKING:  # rich is imported only when a bar is shown
    from rich.progress import Progress, TaskID

    from trainer.run.state import StartInfo

# what signal.signal() returns: the previous handler (a function, SIG_DFL/SIG_IGN, or None when it was
# not installed from Python)
SignalHandler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _eta(seconds: float | None) -> str:
    if seconds is None:  # no measured steps yet (trainer.config.throughput)
        return "-"
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


class ProgressCallbacks(Callbacks):
    def __init__(
        self, stream: TextIO | None = None, *, rich_bar: bool | None = None, min_interval: float = 1.0
    ):
        self.stream = stream or sys.stdout
        self.rich_bar = self.stream.isatty() if rich_bar is None else rich_bar
        self.min_interval = min_interval  # plain mode: at most one step line per this many seconds
        self.total = 0
        self.start_step = 0
        self.tokens_per_step = 0
        self.rate = StepRate()  # ETA and tok/s: smoothed, measured steps only
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_print = -float("inf")
        self._stop_requested = False
        self._old_handler: SignalHandler = None

    # -- Ctrl-C -> graceful stop
    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_requested:
            raise KeyboardInterrupt
        self._stop_requested = True
        self._print("interrupt: stopping after this step and writing a checkpoint (Ctrl-C again to abort)")

    def should_stop(self) -> Literal["stop", "pause"] | None:
        return "stop" if self._stop_requested else None

    def _print(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def on_start(self, info: StartInfo) -> None:
        self.total, self.start_step = info["total_steps"], info["start_step"]
        self.tokens_per_step, self.rate = info["tokens_per_step"], StepRate(info["start_step"])
        try:
            self._old_handler = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            self._old_handler = None
        self._print(
            f"training {info['n_params']:,} parameters on {info['device']} ({info['dtype']}), "
            f"{info['tokens_per_step']:,} tokens/step, steps {info['start_step']}..{info['total_steps']}"
        )
        self._print(f"dtype {info['dtype']}: {info['dtype_reason']}")
        self._print(f"torch.compile {'on' if info['compile'] else 'off'}: {info['compile_reason']}")
        self._print(f"element-wise ops: {info['kernels']}")
        for decided in info["auto"]:
            self._print(decided)
        for note in info["notes"]:
            self._print(f"note: {note}")
        if self.rich_bar:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tps]} tok/s"),
                TimeElapsedColumn(),
                TextColumn("eta {task.fields[eta]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total, completed=self.start_step, loss="-", tps="-", eta="-"
            )

    def on_step(self, metrics: StepMetrics) -> None:
        step, accuracy = metrics.step, metrics.train_accuracy
        acc = "" if accuracy is None else f" | acc {accuracy:.3f}"
        self.rate.observe_log(step, metrics.tokens_per_s, self.tokens_per_step)
        smoothed = self.rate.tokens_per_s(self.tokens_per_step)
        tps, eta = "-" if smoothed is None else f"{smoothed:,.0f}", _eta(self.rate.eta(self.total - step))
        if self._progress is not None and self._task is not None:  # set together in on_start
            self._progress.update(
                self._task,
                completed=step,
                loss=f"{metrics.train_loss:.4f}{acc.replace(' | ', ' ')}",
                tps=tps,
                eta=eta,
            )
            return
        now = time.perf_counter()
        if now - self._last_print < self.min_interval and step not in (self.start_step + 1, self.total):
            return
        self._last_print = now
        self._print(
            f"step {step}/{self.total} | loss {metrics.train_loss:.4f}{acc} | lr {metrics.lr:.2e} | "
            f"grad {metrics.grad_norm:.3f} | {tps} tok/s | eta {eta}"
        )

    def on_eval(self, metrics: EvalMetrics) -> None:
        acc = "" if metrics.val_accuracy is None else f", accuracy {metrics.val_accuracy:.3f}"
        self._print(
            f"eval step {metrics.step}: val_loss {metrics.val_loss:.4f} (perplexity {metrics.val_ppl:.2f}){acc}"
        )

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        self._print(
            f"full validation at step {metrics.step}: loss {metrics.full_valid_loss:.4f}, "
            f"accuracy {metrics.full_valid_mean_token_accuracy:.3f}"
        )

    def on_note(self, message: str) -> None:
        self._print(message)

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self._progress is None:
            self._print(f"checkpoint step {step}: {path}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._old_handler is not None:
            signal.signal(signal.SIGINT, self._old_handler)
            self._old_handler = None
