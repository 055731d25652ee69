"""`sharding: fsdp`: the model sharded across the ranks with FSDP2 (torch.distributed.fsdp.fully_shard),
each transformer block one unit and the rest (embeddings, tied output, final norm) the root unit.

Checkpoints keep our format (trainer.checkpoint: fp32 safetensors of the whole model and optimizer):
saving gathers the full model and optimizer state to rank 0 (every rank takes part) and writes them
through a plain CPU copy; resuming loads the full state into the plain model and optimizer that
start_run builds, then shards both. Unlike DDP, every rank runs every forward: evaluation and the
final full pass run on all ranks (the same batches), and only rank 0 reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from trainer.model.llama import Llama
from trainer.optim.optimizers import make_optimizer

if TYPE_CHECKING:
    from trainer.run.state import TrainRun


def shard_run(run: TrainRun) -> None:
    """Shard run.model in place and rebuild the optimizer over the shards, carrying over the state a
    resumed run loaded into the plain optimizer."""
    full = StateDictOptions(full_state_dict=True)
    state = get_optimizer_state_dict(run.model, run.optimizer, options=full) if run.optimizer.state else None
    for layer in run.model.layers:
        fully_shard(layer)
    fully_shard(run.model)
    run.optimizer = make_optimizer(run.model, run.cfg)
    if state is not None:
        set_optimizer_state_dict(run.model, run.optimizer, state, options=full)
    run.sharded = True


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """FSDP2's no_sync: reduce-scatter the gradients only in the last micro-batch's backward."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(sync)


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_ over sharded gradients returns a DTensor; its value as a plain tensor."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def full_copies(run: TrainRun) -> tuple[Llama, torch.optim.Optimizer] | None:
    """The whole model and optimizer as plain CPU objects on rank 0 (None on the other ranks), for
    trainer.checkpoint to write. Every rank must call it: the state is gathered collectively."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(run.model, options=options)
    optim_state = get_optimizer_state_dict(run.model, run.optimizer, options=options)
    if not run.is_main:
        return None
    model = Llama(run.model_cfg)
    model.load_state_dict(model_state, strict=True)
    optimizer = make_optimizer(model, run.cfg)
    _load_by_name(optimizer, model, optim_state)
    return model, optimizer


def _load_by_name(optimizer: torch.optim.Optimizer, model: Llama, state: dict[str, Any]) -> None:
    """Load a state dict keyed by parameter names (get_optimizer_state_dict's full form) into a plain
    optimizer, locally (set_optimizer_state_dict would expect every rank to join)."""
    names = {id(p): name for name, p in model.named_parameters()}
    sd = optimizer.state_dict()
    index, by_index = 0, {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if names[id(p)] in state["state"]:
                by_index[index] = state["state"][names[id(p)]]
            index += 1
    sd["state"] = by_index
    optimizer.load_state_dict(sd)
