"""The projections a graphed decoding step multiplies by, concatenated once per model.

The training forward concatenates wq|wk|wv and w1|w3 per call: one copy, paid back by one matmul
instead of three (and one for their input gradient). A decoding step reads each projection once for
one token, so a copy per step would move every projection twice more than its matmul reads it.
trainer.model.decoders keeps one PackedWeights per model, shared by its decoders; llama.py reads it
from KVCache.packed while a graphed step runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from trainer.model.llama import Block, Llama


class PackedWeights:
    """Per layer, wq|wk|wv and w1|w3 concatenated. refresh() copies them again, at the same
    addresses (a captured graph reads them there)."""

    def __init__(self, model: Llama) -> None:
        with torch.no_grad():
            self.qkv = [torch.cat(_qkv_weights(block)) for block in _blocks(model)]
            self.w13 = [torch.cat(_w13_weights(block)) for block in _blocks(model)]

    def refresh(self, model: Llama) -> None:
        """Copies the weights again, as they are now (after an optimizer step, a load). Always: torch's
        fused AdamW, the trainer's, writes them without bumping their version counters, so there
        is no cheap sign of a change to wait for; the copy is one pass over the projections."""
        with torch.no_grad():
            for block, qkv, w13 in zip(_blocks(model), self.qkv, self.w13, strict=True):
                torch.cat(_qkv_weights(block), out=qkv)
                torch.cat(_w13_weights(block), out=w13)


def _blocks(model: Llama) -> list[Block]:
    return cast("list[Block]", list(model.layers))


def _qkv_weights(block: Block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = block.attention
    return a.wq.weight, a.wk.weight, a.wv.weight


def _w13_weights(block: Block) -> tuple[torch.Tensor, torch.Tensor]:
    return block.feed_forward.w1.weight, block.feed_forward.w3.weight
