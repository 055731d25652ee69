"""Background checkpoints of a model on CUDA (`pytest -m cuda`): the snapshot copies into pinned
host buffers without blocking, so the test checks that what lands on disk is the state at the
snapshot, not what the next optimizer steps made of it, and that the buffers are pinned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from trainer.checkpoint import save_checkpoint
from trainer.checkpoint_snapshot import OPTIMIZER_FILE, HostBuffers, take_snapshot
from trainer.config import ModelConfig, TrainConfig
from trainer.model.llama import Llama
from trainer.optim.optimizers import make_optimizer
from trainer.run.checkpoint_writer import CheckpointWriter

pytestmark = pytest.mark.cuda(devices=1)


def _step(model: Llama, opt: torch.optim.Optimizer, cfg: ModelConfig) -> None:
    x = torch.randint(0, cfg.vocab_size, (4, cfg.ctx), device="cuda")
    _, loss = model(x, x)
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_a_cuda_snapshot_in_pinned_memory_is_the_state_of_its_step(
    tmp_path: Path, byte_tokenizer: Any
) -> None:
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=128, ctx=128, vocab_size=256)
    train_cfg = TrainConfig(device="cuda")
    torch.manual_seed(0)
    model = Llama(cfg).cuda()
    opt = make_optimizer(model, train_cfg)
    _step(model, opt, cfg)
    kw: dict[str, Any] = dict(
        model=model, model_config=cfg, train_config=train_cfg, tokenizer=byte_tokenizer, optimizer=opt
    )
    sync = save_checkpoint(tmp_path / "sync", state={"step": 1, "tokens_seen": 0}, **kw)
    writer = CheckpointWriter()
    seen: list[HostBuffers] = []

    def take(buffers: HostBuffers) -> Any:
        seen.append(buffers)
        return take_snapshot(state={"step": 1, "tokens_seen": 0}, buffers=buffers, **kw)

    writer.save(take, tmp_path / "bg", None)
    for _ in range(3):  # training goes on on the GPU while the folder is written
        _step(model, opt, cfg)
    writer.wait()
    for name in ("model.safetensors", OPTIMIZER_FILE):
        want, got = load_file(str(sync / name)), load_file(str(tmp_path / "bg" / name))
        assert all(torch.equal(want[k], got[k]) for k in want), name
    assert all(buf.is_pinned() for buf in seen[0].tensors())
