"""Log-probabilities of tokens as the model gives them: the log-softmax of its logits at a position,
before any temperature, top-k, top-p, penalty or bias (what OpenAI's `logprobs` report).

- `LogprobRecorder` wraps the pick of trainer.sampling.decode: for each token picked it records the
  picked token's logprob and the `top` likeliest (id, logprob), read back in the order the tokens
  come out (`pop()` after each token the generator yields). The work is queued on the logits'
  device before the next decoding step, so a graphed decoder's static logits are read in time.
- `score(model, ids, top)`: one forward over `ids` (at most ctx of them): for each token after the
  first, its logprob given the ones before and the `top` likeliest there (echo's prompt scoring).

Neither is used unless logprobs are asked for: the decoding loop is unchanged otherwise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainer.model.llama import Llama

# A logprob JSON cannot hold (-inf: a token the model gives no chance at all): OpenAI's floor
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    logprob: float
    top: list[tuple[int, float]]  # the likeliest (id, logprob), most likely first


def _finite(value: float) -> float:
    return value if value >= LOGPROB_FLOOR else LOGPROB_FLOOR  # -inf and nan alike


def _unpack(row: list[float], top: int) -> TokenLogprob:
    values, ids = row[1 : 1 + top], row[1 + top :]
    return TokenLogprob(_finite(row[0]), [(int(i), _finite(v)) for i, v in zip(ids, values, strict=True)])


class LogprobRecorder:
    """Records, for each token trainer.sampling picks, its logprob and the `top` likeliest tokens."""

    def __init__(self, top: int) -> None:
        self.top = top
        self._pending: deque[tuple[torch.Tensor, torch.cuda.Event | None]] = deque()

    def wrap(self, pick: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """`pick`, recording the logprobs of what it picks from the raw logits it is given."""

        def recording(logits: torch.Tensor) -> torch.Tensor:
            token = pick(logits)
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            parts = [logprobs.index_select(0, token.view(1).long())]
            if self.top:
                best = torch.topk(logprobs, min(self.top, logprobs.numel()))
                parts += [best.values, best.indices.float()]
            # a copy queued before the next step (which may overwrite `logits`), read at pop(): on
            # CUDA an event behind it, so that reading it does not wait for the step queued next
            host = torch.cat(parts).to("cpu", non_blocking=logits.is_cuda)
            copied = None
            if logits.is_cuda:
                copied = torch.cuda.Event()
                copied.record()
            self._pending.append((host, copied))
            return token

        return recording

    def pop(self) -> TokenLogprob:
        """The record of the oldest token picked and not yet popped."""
        row, copied = self._pending.popleft()
        if copied is not None:
            copied.synchronize()
        return _unpack(row.tolist(), min(self.top, (row.numel() - 1) // 2))


def score(model: Llama, ids: Sequence[int], top: int) -> list[TokenLogprob | None]:
    """For each of `ids` (at most the model's ctx), its logprob after the ones before it and the
    `top` likeliest tokens there; None for the first, which has nothing before it."""
    if len(ids) > model.cfg.ctx:
        raise ValueError(f"{len(ids)} tokens exceed the model's context of {model.cfg.ctx}")
    if not ids:
        return []
    device = next(model.parameters()).device
    with torch.no_grad():
        logits, _ = model(torch.tensor([list(ids)], dtype=torch.long, device=device))
        logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1)  # position i predicts ids[i + 1]
        targets = torch.tensor(list(ids[1:]), dtype=torch.long, device=device)
        chosen = logprobs.gather(1, targets.view(-1, 1))
        parts = [chosen]
        k = min(top, logprobs.size(-1))
        if k:
            best = torch.topk(logprobs, k, dim=-1)
            parts += [best.values, best.indices.float()]
        rows = torch.cat(parts, dim=1).cpu().tolist()
    return [None, *(_unpack(row, k) for row in rows)]
