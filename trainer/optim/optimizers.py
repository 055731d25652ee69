"""Optimisers and learning-rate schedules.

`lr_at` is a pure function of the step so that a resumed run recomputes exactly the rates an
uninterrupted one used (nothing about the schedule is stored in a checkpoint).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trainer.config import TrainConfig
from trainer.config.estimate import LBFGS_HISTORY_SIZE
from trainer.optim.adamw import AdamW
from trainer.optim.muon import MuonAdamW, muon_param_groups

if TYPE_CHECKING:
    from trainer.model.llama import Llama


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based: the rate used by the (step+1)-th update).

    All schedules share a linear warmup of `resolved_warmup(total_steps)` steps that reaches the
    base rate at its end and never yields 0 (nanoGPT: lr * (step+1) / (warmup+1)). Then:
      cosine           nanoGPT: cosine from learning_rate down to min_lr at total_steps, then flat.
      cosine-restarts  llama.cpp's --cos-decay-steps/--cos-decay-restart/--cos-decay-alpha: the
                       first cycle lasts cos_decay_steps (default total_steps), each next cycle is
                       cos_decay_restart times longer, each decays from learning_rate to
                       cos_decay_alpha * learning_rate.
      constant         learning_rate.
    """
    base = cfg.learning_rate
    warmup = cfg.resolved_warmup(total_steps)
    if step < warmup:
        return base * (step + 1) / (warmup + 1)
    if cfg.schedule == "constant":
        return base
    if cfg.schedule == "cosine":
        min_lr = cfg.resolved_min_lr
        decay_steps = total_steps - warmup
        if decay_steps <= 0 or step >= total_steps:
            return min_lr
        ratio = (step - warmup) / decay_steps
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (base - min_lr)
    if cfg.schedule == "cosine-restarts":
        t = float(step - warmup)
        cycle = float(cfg.cos_decay_steps or max(1, total_steps))
        while t > cycle:  # llama.cpp's cosine_decay_restart: walk to the cycle that contains t
            t -= cycle
            cycle *= cfg.cos_decay_restart
        decay = 0.5 * (1.0 + math.cos(math.pi * min(t, cycle) / cycle))
        alpha = cfg.cos_decay_alpha
        return base * ((1.0 - alpha) * decay + alpha)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


def make_optimizer(model: Llama, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (decay only on >=2-D weights, the embedding at its own rate: model.optimizer_groups),
    Muon with AdamW (trainer.optim.muon) or L-BFGS.

    AdamW uses torch's fused kernel, on CUDA and on CPU alike: on CPU it updates the parameters in
    a third of the single-tensor loop's time (2.5 vs 7.7 ms per step at nanoGPT's shape, 2 cores),
    and like it, it is deterministic, so resumed runs stay bitwise reproducible. It is called
    through trainer.optim.adamw.AdamW, which saves the 1.2 s torch.optim spends importing torch._dynamo.

    L-BFGS (llama.cpp offers it too) takes one outer iteration per training step with a
    strong-Wolfe line search, so a step may evaluate the batch several times. It has no weight
    decay (weight_decay is ignored) and no gradient clipping; the lr schedule scales the initial
    step length of each line search.
    """
    if cfg.optimizer == "adamw":
        groups = model.optimizer_groups(cfg.weight_decay, cfg.embedding_lr_scale)
        return AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    if cfg.optimizer == "muon":
        groups = muon_param_groups(model, cfg)
        return MuonAdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    if cfg.optimizer == "lbfgs":
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.LBFGS(
            params,
            lr=cfg.learning_rate,
            max_iter=1,
            history_size=LBFGS_HISTORY_SIZE,
            line_search_fn="strong_wolfe",
        )
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the schedule's rate `lr` (times a group's `lr_scale`, where it has one)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
