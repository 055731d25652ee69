"""What the ranks of a run over several processes do together inside the loop
(trainer.distributed.launch starts them). With one process none of it runs: no process group.

Rules the ranks keep (see docs/ARCHITECTURE.md, "Distributed training"):
- every rank holds the same sampler and draws the whole global batch (batch_size x grad_accum x
  devices windows) each step; rank r trains on the r-th contiguous slice of it. That is the order a
  single process with grad_accum x devices micro-batches would use, so the data, the loss and the
  sampler state (saved in checkpoints) do not depend on the world size;
- each micro-batch's summed loss is divided by the global batch's target count (every rank counts it
  from the whole batch it drew, so no collective is needed) and multiplied by the world size, which
  cancels DDP's averaging: the gradient equals the single-process one;
- rank 0 alone logs, evaluates, writes checkpoints and calls the callbacks; its stop/pause decision
  reaches every rank in the all-reduce of the logged loss (the one sync per logged step); with
  early stopping on, its decision after each evaluation reaches them in a broadcast right away, so
  the ranks stop at the step one process would. With sharding fsdp (trainer.run.fsdp) every rank joins evaluations and saves, rank 0 still reports.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from trainer.config import ConfigError, TrainConfig

STOP_CODES: dict[str | None, int] = {None: 0, "stop": 1, "pause": 2, "time_limit": 3, "early_stop": 4}


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def check_devices(cfg: TrainConfig) -> None:
    """ConfigError when `devices` processes cannot run on this machine with this config."""
    if cfg.devices == 1:
        return
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda:
        n = torch.cuda.device_count()
        if n < cfg.devices:
            raise ConfigError(
                [
                    (
                        "devices",
                        f"{cfg.devices} processes need {cfg.devices} CUDA devices; this machine has {n}",
                    )
                ]
            )


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of `values` over the ranks (each holds its share)."""
    dist.all_reduce(values)
    return values


def agree_stop(code: int, device: torch.device) -> int:
    """Rank 0's stop code, for every rank (a broadcast: once before the first step, and after each
    evaluation when early stopping is on)."""
    t = torch.tensor([code], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return int(t.item())
