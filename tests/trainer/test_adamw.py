"""trainer.optim.adamw.AdamW: torch's fused AdamW update, bitwise, with torch.optim's state-dict form and
without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from trainer.config import ModelConfig
from trainer.model.llama import Llama
from trainer.optim.adamw import AdamW


def groups(model: Llama) -> list[dict]:
    return model.optimizer_groups(weight_decay=0.1, embedding_lr_scale=10.0)


def train_steps(model: Llama, optimizer: torch.optim.Optimizer, steps: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        x = torch.randint(0, 258, (4, 16), generator=gen)
        _, loss = model(x, x)
        loss.backward()
        for group in optimizer.param_groups:  # a schedule, as trainer.optim.optimizers.set_lr sets it
            group["lr"] = 1e-2 / (step + 1) * group.get("lr_scale", 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def fresh() -> Llama:
    torch.manual_seed(0)
    return Llama(ModelConfig(n_layer=2, n_head=2, n_embd=32, ctx=16, vocab_size=258))


def test_the_update_is_torchs_fused_adamw_bitwise() -> None:
    ours, theirs = fresh(), fresh()
    train_steps(ours, AdamW(groups(ours), lr=1e-2, betas=(0.8, 0.95), eps=1e-8), 6)
    train_steps(
        theirs, torch.optim.AdamW(groups(theirs), lr=1e-2, betas=(0.8, 0.95), eps=1e-8, fused=True), 6
    )
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_state_dict_round_trip_and_torchs_form() -> None:
    model = fresh()
    optimizer = AdamW(groups(model), lr=1e-2, betas=(0.8, 0.95), eps=1e-8)
    train_steps(model, optimizer, 3)
    saved = optimizer.state_dict()

    # the same form as torch.optim.AdamW's, which it loads
    reference = torch.optim.AdamW(groups(model), lr=1e-2, betas=(0.8, 0.95), eps=1e-8, fused=True)
    reference.load_state_dict(saved)
    assert sorted(saved["state"]) == sorted(reference.state_dict()["state"])
    assert [g["params"] for g in saved["param_groups"]] == [
        g["params"] for g in reference.state_dict()["param_groups"]
    ]
    assert saved["state"][0]["step"].dtype == torch.float32 and float(saved["state"][0]["step"]) == 3

    # loaded into a fresh one, training goes on exactly as the original does
    copy = fresh()
    copy.load_state_dict(model.state_dict())
    resumed = AdamW(groups(copy), lr=1e-2, betas=(0.8, 0.95), eps=1e-8)
    resumed.load_state_dict(saved)
    train_steps(model, optimizer, 2, seed=1)
    train_steps(copy, resumed, 2, seed=1)
    for a, b in zip(model.parameters(), copy.parameters(), strict=True):
        assert torch.equal(a, b)

    with pytest.raises(ValueError, match="other parameter groups"):
        AdamW(groups(fresh())[:2], lr=1e-2, betas=(0.9, 0.95), eps=1e-8).load_state_dict(saved)


def test_building_and_stepping_it_does_not_import_dynamo() -> None:
    code = (
        "import sys, torch\n"
        "from trainer.optim.adamw import AdamW\n"
        "p = torch.nn.Parameter(torch.ones(3))\n"
        "o = AdamW([{'params': [p]}], lr=0.1, betas=(0.9, 0.95), eps=1e-8)\n"
        "p.sum().backward(); o.step(); o.zero_grad(); o.load_state_dict(o.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
