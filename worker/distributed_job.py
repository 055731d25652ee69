"""A job with `devices` > 1: its run in that many processes through torchrun's launcher
(trainer.distributed.launch.launch_train), the worker's callbacks relayed to rank 0.

Rank 0 calls the callbacks, which stay in the worker process (the lease, cancel/pause, the
shutdown flag and the database are the worker's) through trainer.distributed.callback_relay. SIGTERM stays the
worker's too: it sets the shutdown flag, rank 0 reads it at the next logged step and the job
checkpoints and re-queues as a one-process job would. A rank that dies (killed, out of memory)
raises trainer.distributed.launch.RankLost: the attempt is dead (worker/job_ending.py re-queues the job to
resume from its last checkpoint); the ranks die with the worker (PR_SET_PDEATHSIG)."""

from __future__ import annotations

from pathlib import Path

from trainer.config import TrainConfig
from trainer.distributed.callback_relay import CallbackRelay
from trainer.distributed.launch import launch_train
from trainer.run.loop import TrainResult
from trainer.run.report import Callbacks
from worker.job_inputs import TrainingInputs


def train_distributed(
    inputs: TrainingInputs, train_cfg: TrainConfig, out_dir: Path, callbacks: Callbacks
) -> TrainResult:
    """trainer.run.loop.train in train_cfg.devices processes, reporting through `callbacks`."""
    with CallbackRelay(callbacks) as relay:
        try:
            return launch_train(
                inputs.model_cfg,
                train_cfg,
                inputs.train_path,
                out_dir,
                relay.factory,
                tokenizer=inputs.tokenizer,
                validation_path=inputs.val_path,
                resume=inputs.resume_path or False,
                init_from=inputs.init_from,
                handle_signals=False,
            )
        except BaseException:
            relay.raise_error()  # e.g. DatabaseUnavailable from a callback, as if raised here
            raise
