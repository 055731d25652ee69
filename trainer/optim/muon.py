"""`optimizer: muon`: Muon for the transformer blocks' matrices, AdamW for everything else, as one
optimizer (the split modded-nanogpt trains with).

Muon (Keller Jordan, 2024; kellerjordan.github.io/posts/muon) is Nesterov momentum whose step for a
weight matrix is replaced by the nearest (semi-)orthogonal matrix, approximated by five Newton-Schulz
iterations in bfloat16: every direction of the momentum moves the weights by about the same amount,
rare directions as much as the dominant one. It suits the hidden matrices (the attention's wq, wk,
wv, wo and the feed-forward's w1, w2, w3); the token embedding (a lookup: each row sees only its
token's gradient), the output projection and the norms' gains stay with AdamW.

The update is torch.optim.Muon's (torch >= 2.9; tests/trainer/test_muon.py checks it bit for bit):
momentum kept as an average (buf += (1 - m) (g - buf)), the Nesterov look-ahead g + m (buf - g),
decoupled weight decay, then the orthogonalized step at lr x sqrt(max(1, rows / cols)). It is written
here rather than called, for AdamW's reasons (trainer/optim/adamw.py): torch.optim imports
torch._dynamo when an optimizer is built (a second of every run's start-up), and one class keeps one
state form, which the checkpoints store by parameter name (the Muon matrices' `momentum_buffer`, the
others' AdamW `step`, `exp_avg`, `exp_avg_sq`).

Rates: the schedule (trainer.optim.optimizers.lr_at) gives learning_rate's curve; set_lr multiplies
it by each group's `lr_scale`, and the Muon group's is muon_learning_rate / learning_rate, so both
optimizers follow the same warmup and decay from their own peaks. Weight decay: the Muon group's is
weight_decay / lr_scale, so a matrix shrinks per step by the schedule's rate x weight_decay, as it
would under AdamW.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from trainer.config import TrainConfig
from trainer.optim.adamw import AdamW

if TYPE_CHECKING:
    from trainer.model.llama import Llama

# the quintic iteration's coefficients (Muon's: they raise small singular values fastest and leave
# every one somewhere in about [0.5, 1.5], which trains as well as exactly 1), its steps, and the
# floor of the norm it first divides by (a zero matrix stays zero)
NEWTON_SCHULZ = (3.4445, -4.775, 2.0315)
NEWTON_SCHULZ_STEPS = 5
NORM_FLOOR = 1e-7


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """Whether Muon trains parameter `name`: the 2-D weights inside the blocks (the norms' gains
    there are 1-D; the embedding and the output projection are outside them).
    trainer.config.estimate counts these as parameter_breakdown's attention + feed_forward."""
    return name.startswith("layers.") and p.dim() == 2


def muon_param_groups(model: Llama, cfg: TrainConfig) -> list[dict[str, Any]]:
    """The Muon group (the hidden matrices, flagged `muon`) first, then model.optimizer_groups'
    AdamW groups without them."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = [p for n, p in named if is_hidden_matrix(n, p)]
    hidden = {id(p) for p in matrices}
    scale = cfg.muon_learning_rate / cfg.learning_rate
    groups: list[dict[str, Any]] = [
        {
            "params": matrices,
            "muon": True,
            "lr_scale": scale,
            "momentum": cfg.muon_momentum,
            "weight_decay": cfg.weight_decay / scale,
        }
    ]
    for group in model.optimizer_groups(cfg.weight_decay, cfg.embedding_lr_scale):
        groups.append({**group, "params": [p for p in group["params"] if id(p) not in hidden]})
    return groups


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA, as torch.optim.Muon; float32 on a CPU, where bfloat16 matmuls without
    native support run at ~1 GFLOP/s against fp32's ~160 (bench/README.md, trainer_throughput)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def orthogonalize(matrix: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A matrix (of `dtype`) with `matrix`'s singular vectors and singular values near 1.

    Scaled to Frobenius norm 1 (so every singular value is <= 1), each iteration maps the singular
    values s to a s + b s^3 + c s^5: X <- a X + (b A + c A^2) X with A = X X^T, computed on the wide
    orientation so that A is the smaller Gram matrix."""
    a, b, c = NEWTON_SCHULZ
    x = matrix.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=NORM_FLOOR)
    for _ in range(NEWTON_SCHULZ_STEPS):
        gram = x @ x.T
        polynomial = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, polynomial, x, beta=a)
    return x.T if tall else x


class MuonAdamW(AdamW):
    """AdamW (trainer.optim.adamw) whose groups flagged `muon` take Muon's update instead, with the
    group's `momentum`; state_dict, load_state_dict and zero_grad are AdamW's, over both kinds."""

    def _update_group(self, group: dict[str, Any]) -> None:
        if not group.get("muon"):
            super()._update_group(group)
            return
        lr, momentum = group["lr"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            average = state["momentum_buffer"]
            average.lerp_(p.grad, 1 - momentum)
            step = orthogonalize(p.grad.lerp(average, momentum), newton_schulz_dtype(p.device))
            p.mul_(1 - lr * group["weight_decay"])
            # x sqrt(fan_out / fan_in) for a matrix that widens its input (w1, w3; Muon's own rule),
            # so that its output moves per unit of input as much as a square matrix's
            p.add_(step, alpha=-lr * math.sqrt(max(1.0, p.size(0) / p.size(1))))
