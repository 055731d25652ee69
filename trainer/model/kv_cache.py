"""The key/value cache of incremental decoding (trainer.sampling, trainer.model.decoders): per layer,
the keys and values of the positions decoded so far."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from trainer.config import ModelConfig

if TYPE_CHECKING:
    from trainer.model.packed_weights import PackedWeights


class KVCache:
    """Per-layer key/value buffers for incremental decoding: (B, n_kv_head, ctx, head_dim)."""

    def __init__(self, cfg: ModelConfig, batch: int, device: torch.device, dtype: torch.dtype):
        shape = (batch, cfg.kv_heads, cfg.ctx, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.pos = 0  # number of positions already filled
        # Set while decoding through a captured CUDA graph (trainer.model.decoders): the position
        # of the one new token, held on the device so that one graph serves every step. Keys are
        # then written there and attention reads the whole buffer, `visible` (additive: 0 up to the
        # position, -inf past it) masking the rest.
        self.position: torch.Tensor | None = None
        self.visible: torch.Tensor | None = None
        # The projections that the graphed step multiplies by, concatenated once (PackedWeights).
        self.packed: PackedWeights | None = None

    def keys_values(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores the new keys/values of `layer` and returns every key/value to attend to, in
        `dtype` (eager decoding; graphed decoding writes them in fused_ops.decode_qkv)."""
        start, T = self.pos, k.size(2)
        self.k[layer][:, :, start : start + T] = k
        self.v[layer][:, :, start : start + T] = v
        return self.k[layer][:, :, : start + T].to(dtype), self.v[layer][:, :, : start + T].to(dtype)
