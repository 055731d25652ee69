"""AdamW through torch's fused kernel, without torch.optim's machinery.

torch.optim.Optimizer wraps its methods so that torch.compile leaves them alone, and the first call
of any of them imports torch._dynamo: 1.2 s of a 2.6 s start-up on a 2-core CPU, paid by every
`fromscratch train` before its first step. This optimizer makes the same update with the same
kernel (`torch._fused_adamw_`, what `torch.optim.AdamW(fused=True)` calls; bitwise equal, tested)
and keeps its state in the same form (per parameter: `step`, a float32 scalar tensor on the
parameter's device, `exp_avg`, `exp_avg_sq`), so checkpoints do not tell the two apart. It is a
torch.optim.Optimizer subclass for isinstance checks (GradScaler, torch.distributed's state-dict
helpers) but defines every method it is called through itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        groups: Iterable[dict[str, Any]],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float = 0.0,
    ) -> None:
        # not Optimizer.__init__: its add_param_group is one of the wrapped methods
        self.defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": True,
        }
        self.state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        group = {**self.defaults, **param_group, "params": list(param_group["params"])}
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._update_group(group)
        return loss

    def _update_group(self, group: dict[str, Any]) -> None:
        """The AdamW update of one parameter group (trainer.optim.muon.MuonAdamW gives its Muon
        groups another)."""
        # the fused kernel takes tensors of one device and dtype at a time
        buckets: dict[tuple[torch.device, torch.dtype], list[list[torch.Tensor]]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            lists = buckets.setdefault((p.device, p.dtype), [[], [], [], [], []])
            for i, t in enumerate((p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])):
                lists[i].append(t)
        beta1, beta2 = group["betas"]
        for params, grads, exp_avgs, exp_avg_sqs, steps in buckets.values():
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                amsgrad=False,
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's form: state by parameter index, groups with their parameters' indices."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                ids.append(index.setdefault(id(p), len(index)))
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        params = [p for group in self.param_groups for p in group["params"]]
        state = {index[id(p)]: dict(self.state[p]) for p in params if self.state.get(p)}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Per-parameter state onto this optimizer's parameters, in their order (moments on the
        parameter's device and dtype, `step` float32 on its device), and the groups' hyperparameters.
        """
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
            len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, self.param_groups, strict=True)
        ):
            raise ValueError("the saved optimizer state has other parameter groups than this optimizer")
        self.state = defaultdict(dict)
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
            for i, p in zip(saved["params"], group["params"], strict=True):
                if i not in state_dict["state"]:
                    continue
                self.state[p] = {  # copies: the optimizer the state came from may go on updating its own
                    k: v.to(device=p.device, dtype=torch.float32 if k == "step" else p.dtype, copy=True)
                    if isinstance(v, torch.Tensor)
                    else v
                    for k, v in state_dict["state"][i].items()
                }
