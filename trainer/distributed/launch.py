"""Data-parallel training: `launch_train` runs `devices` processes through torchrun's launcher
(torch.distributed.launcher.elastic_launch, a standalone rendezvous on loopback), each of which calls
trainer.run.loop.train inside a process group (NCCL on CUDA, gloo on CPU) with the model wrapped in
DistributedDataParallel. With devices 1 nothing here runs: no process group, today's path.

The rules the ranks keep inside the loop are in trainer.run.collectives.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainer.config import ModelConfig, TrainConfig
from trainer.run.collectives import check_devices, local_rank

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig

    from trainer.data.tokenizers import Tokenizer
    from trainer.run.loop import TrainResult
    from trainer.run.report import Callbacks

LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# The launcher handles at least one signal; with handle_signals=False it gets this one, which no part
# of fromscratch sends or handles, so the caller's own handlers stay in place.
UNUSED_SIGNAL = signal.SIGUSR2


class RankLost(RuntimeError):
    """A rank of the run died without raising (killed by a signal: SIGKILL, the OOM killer...).
    The run cannot continue; it may resume from its last checkpoint."""

    def __init__(self, rank: int, world: int, how: str):
        self.rank, self.world, self.how = rank, world, how
        super().__init__(f"training process {rank} of {world} died ({how})")

    def __reduce__(self) -> tuple[type[RankLost], tuple[int, int, str]]:
        return RankLost, (self.rank, self.world, self.how)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def launch_train(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    train_path: str | os.PathLike[str],
    out_dir: Path,
    callbacks_factory: Callable[[], Callbacks] | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    validation_path: str | os.PathLike[str] | None = None,
    resume: bool | Path = False,
    init_from: Path | None = None,
    handle_signals: bool = True,
) -> TrainResult:
    """trainer.run.loop.train in cfg.devices processes; returns rank 0's TrainResult.

    The configs, paths and tokenizer travel to the ranks as JSON. `callbacks_factory` (a picklable
    callable: a module-level class or function, or trainer.distributed.callback_relay's) is called in rank 0
    only, which alone reports. The exception of the rank that failed first is raised here as it
    was raised there; a rank killed by a signal raises RankLost. handle_signals=False leaves
    SIGTERM/SIGHUP/SIGQUIT to the caller (a worker stops the run through its callbacks); the
    ranks die with the calling process either way."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    if not isinstance(train_path, str | os.PathLike):
        raise ValueError("distributed training reads a data file; pass its path, not prepared TokenData")
    check_devices(cfg)
    spec = json.dumps(
        {
            "model": model_cfg.to_dict(),
            "train": cfg.to_dict(),
            "train_path": str(train_path),
            "out_dir": str(out_dir),
            "tokenizer": tokenizer.to_json() if tokenizer is not None else None,
            "validation_path": str(validation_path) if validation_path is not None else None,
            "resume": str(resume) if isinstance(resume, Path) else resume,
            "init_from": str(init_from) if init_from is not None else None,
        }
    )
    launch = _launch_config(cfg.devices, handle_signals)
    handlers = _current_handlers()  # the launcher installs its own and never puts ours back
    with tempfile.TemporaryDirectory(prefix="fromscratch-ranks-") as errors:
        try:
            results = elastic_launch(launch, _rank_main)(spec, callbacks_factory, errors)
        except ChildFailedError as failed:
            raise _rank_error(failed, Path(errors), cfg.devices) from None
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    result = results[0]
    assert result is not None
    return result


def _launch_config(devices: int, handle_signals: bool) -> LaunchConfig:
    """torchrun --standalone's settings: one node, `devices` spawned ranks, no restarts."""
    from torch.distributed.launcher.api import LaunchConfig

    # SIGINT is the caller's (the CLI lets rank 0 stop the run with a checkpoint); the others make
    # the launcher stop the ranks
    signals = ",".join(s.name for s in LAUNCHER_SIGNALS) if handle_signals else UNUSED_SIGNAL.name
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=devices,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",  # a TCP store hosted by this process, on any free port
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        local_addr="127.0.0.1",
        signals_to_handle=signals,
    )


def _current_handlers() -> dict[signal.Signals, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # the launcher installs handlers only from the main thread
    # None: a handler not set from Python, which cannot be put back (nor was it replaced by one)
    return {sig: h for sig in LAUNCHER_SIGNALS if (h := signal.getsignal(sig)) is not None}


def _rank_error(failed: ChildFailedError, errors: Path, world: int) -> BaseException:
    """What ended the run: the exception of the rank that failed first (the launcher stops the
    others then, whose own errors are only the consequence), RankLost when that rank was killed
    by a signal, else the launcher's error."""
    saved: dict[int, BaseException] = {}
    for path in errors.glob("rank-*.pickle"):
        try:
            err = pickle.loads(path.read_bytes())  # written by our own rank process just now
        except Exception:
            continue
        if isinstance(err, BaseException):
            saved[int(path.stem.split("-")[1])] = err
    for rank in sorted(failed.failures):
        if rank in saved:
            return saved[rank]
        exitcode = failed.failures[rank].exitcode
        if exitcode < 0:
            return RankLost(rank, world, _signal_name(-exitcode))
    return saved[min(saved)] if saved else failed


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _rank_main(spec_json: str, callbacks_factory: Callable[[], Callbacks] | None, errors: str) -> Any:
    """One rank: join the process group, train, leave it. Runs in a process the launcher spawned."""
    from trainer.data.tokenizers import tokenizer_from_json
    from trainer.run.loop import train
    from trainer.run.setup import resolve_device

    spec = json.loads(spec_json)
    cfg = TrainConfig.from_dict(spec["train"])
    rank = int(os.environ["RANK"])
    _die_with_parent()
    if rank != 0:  # Ctrl-C reaches every process of the terminal: rank 0's callbacks decide the stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        device = resolve_device(cfg)
        # longer than NCCL's default 10 minutes: the other ranks wait while rank 0 evaluates and saves
        init: dict[str, Any] = {"backend": backend_for(device), "timeout": datetime.timedelta(minutes=30)}
        if device.type == "cuda":
            torch.cuda.set_device(local_rank())
            init["device_id"] = torch.device("cuda", local_rank())
        elif "OMP_NUM_THREADS" not in os.environ:  # the ranks share the machine's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.devices))
        dist.init_process_group(**init)
        try:
            resume = spec["resume"]
            return train(
                ModelConfig.from_dict(spec["model"]),
                cfg,
                spec["train_path"],
                Path(spec["out_dir"]),
                callbacks_factory() if callbacks_factory is not None and rank == 0 else None,
                tokenizer=tokenizer_from_json(spec["tokenizer"]) if spec["tokenizer"] else None,
                validation_path=spec["validation_path"],
                resume=Path(resume) if isinstance(resume, str) else resume,
                init_from=Path(spec["init_from"]) if spec["init_from"] else None,
            )
        finally:
            dist.destroy_process_group()
    except BaseException as err:
        try:
            Path(errors, f"rank-{rank}.pickle").write_bytes(pickle.dumps(err))
        except Exception:
            Path(errors, f"rank-{rank}.pickle").write_bytes(
                pickle.dumps(RuntimeError(f"rank {rank}: {err!r}"))
            )
        raise


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when the process that launched it dies (a SIGKILLed worker
    must not leave ranks training on). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher died before the call: nothing will send the signal
        os._exit(1)
