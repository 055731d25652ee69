"""The LLaMA model: token embedding -> n_layer x [RMSNorm -> GQA attention with RoPE -> residual;
RMSNorm -> SwiGLU -> residual] -> RMSNorm -> output projection. Dropout (`drop`, training mode only)
on the embedding output, the attention probabilities and both residual branches.

Deltas from GPT-2 (nanoGPT) are marked `# llama:`. RoPE convention: the "rotate_half" (NeoX /
Hugging Face) layout, where within the first `n_rot` dims of a head, dim i pairs with dim
i + n_rot/2. Hugging Face's LlamaForCausalLM uses the same layout, so the HF export copies
weights as they are; llama.cpp's `llama` arch rotates adjacent pairs (Meta's layout), so the
GGUF export permutes the rows of wq/wk (see trainer/export/gguf.py).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainer.config import ModelConfig
from trainer.model.fused_ops import (
    add_rms_norm,
    apply_rope,
    compute_dtype,
    decode_qkv,
    qkv_heads,
    rms_norm,
    swiglu,
)
from trainer.model.kv_cache import KVCache
from trainer.model.linear_cross_entropy import fused_applies, linear_cross_entropy

if TYPE_CHECKING:
    from trainer.model.graphed_blocks import GraphedBlocks


def default_init_std(n_embd: int) -> float:
    """GPT-2's 0.02, tuned at its width 768, scaled as 1/sqrt(width) like a fan-in init: a fixed
    0.02 starts narrow models too small, and they take longer to reach a given loss (at width 128:
    ~505 steps to nanoGPT's final validation loss with 0.02, ~430 with this rule's 0.049;
    bench/README.md, "time to quality")."""
    return 0.02 * math.sqrt(768 / n_embd)


class RMSNorm(nn.Module):
    # llama: RMSNorm instead of LayerNorm, computed in float32 whatever the autocast dtype.
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def after_add(self, x: torch.Tensor, h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + h, this norm of it): a residual add and the norm that reads the sum, one kernel each
        way on CUDA (fused_ops.add_rms_norm); h None: (x, this norm of x)."""
        return (x, self(x)) if h is None else add_rms_norm(x, h, self.weight, self.eps)


def rope_cache(
    cfg: ModelConfig, length: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (length, n_rot) in the rotate_half layout (frequencies repeated twice)."""
    inv_freq = 1.0 / (
        cfg.rope_theta ** (torch.arange(0, cfg.n_rot, 2, dtype=torch.float32, device=device) / cfg.n_rot)
    )
    t = torch.arange(length, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)  # (T, n_rot/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, n_rot)
    return emb.cos(), emb.sin()


def drop(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """x with each element zeroed with probability p (the rest scaled by 1 / (1 - p)) while training;
    otherwise x itself: at p = 0 and in eval mode no op enters the graph and nothing draws from the
    RNG, so such a model computes exactly what a model without dropout does."""
    return F.dropout(x, p) if training and p > 0 else x


IGNORE_INDEX = -100  # a target the loss leaves out (F.cross_entropy's default ignore_index)

CPU_FP32_ATTENTION_MIN_HEAD_DIM = 16


def attention_dtype(x: torch.Tensor, head_dim: int) -> torch.dtype:
    """Attention runs in float32 on CPU (q and k leave RoPE in float32 anyway): torch's CPU
    flash-attention kernel is slower in bf16 than in float32 there, forward + backward 1.7x at
    head_dim 64, 3.8x at 16, except at tiny head dims (8: bf16 1.3x faster). On CUDA it runs in the
    matmul dtype. (bench/README.md has the measurements.)"""
    if x.device.type == "cpu" and head_dim >= CPU_FP32_ATTENTION_MIN_HEAD_DIM:
        return torch.float32
    return compute_dtype(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout  # on the attention probabilities, in training only
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        # llama: separate q/k/v (GQA: k and v have n_kv_head heads), no biases.
        self.wq = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """x: (B, T, n_embd); cos/sin: (T, n_rot) rows of rope_cache for these positions."""
        B, T, _ = x.shape
        H, KV, hd = self.n_head, self.n_kv_head, self.head_dim
        cdt, attn_dtype = compute_dtype(x), attention_dtype(x, hd)
        if cache is None or cache.position is not None:
            # One matmul for q, k and v (and one for their input gradient), on the weights
            # concatenated per call. Graphed decoding too, on weights concatenated once (packed):
            # three projections and two RoPEs are a dozen kernels in the graph. The eager decoding
            # path below keeps three so as not to copy the weights for every token.
            packed = cache.packed if cache is not None else None
            w = packed.qkv[layer] if packed else torch.cat((self.wq.weight, self.wk.weight, self.wv.weight))
            qkv = F.linear(x, w).view(B, T, H + 2 * KV, hd)
            # llama: rotary positions; q (B, H, T, hd), k and v (B, KV, T, hd)
            if cache is not None and cache.position is not None:  # graphed decoding: k, v into the cache
                caches = cache.k[layer], cache.v[layer]
                q = decode_qkv(qkv, cos, sin, (H, KV), attn_dtype, caches, cache.position)
                k, v = caches[0].to(attn_dtype), caches[1].to(attn_dtype)
            else:
                q, k, v = qkv_heads(qkv, cos, sin, (H, KV), attn_dtype)
        else:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (T, 1, n_rot): RoPE on (B, T, heads, hd)
            q = apply_rope(self.wq(x).view(B, T, H, hd), cos, sin, attn_dtype).transpose(
                1, 2
            )  # (B, H, T, hd)
            k = apply_rope(self.wk(x).view(B, T, KV, hd), cos, sin).transpose(1, 2)  # (B, KV, T, hd)
            v = self.wv(x).view(B, T, KV, hd).transpose(1, 2)
            k, v = cache.keys_values(layer, k, v, attn_dtype)
        # llama: grouped-query attention; enable_gqa lets SDPA broadcast kv heads without a copy.
        gqa = KV != H
        with (
            torch.autocast(x.device.type, enabled=False)
            if torch.is_autocast_enabled(x.device.type)
            else contextlib.nullcontext()
        ):  # autocast would cast a float32 attention back down
            # A whole sequence or a prefill is causal; one new query (decoding) sees every key.
            causal = cache is None or T > 1
            # SDPA drops the probabilities inside the fused kernel (CUDA's flash and memory-efficient
            # kernels do; torch's CPU flash kernel does not, so on CPU SDPA falls back to its math
            # path while dropout_p > 0: docs/HYPERPARAMETERS.md, "dropout")
            p = self.dropout if self.training else 0.0
            mask = cache.visible if cache is not None else None
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa, dropout_p=p
            )
        return self.wo(_token_rows(y, cdt))


def _token_rows(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The attention output (B, H, T, hd) as (B, T, H*hd) in the matmul dtype: transpose and cast in
    one copy. A view does where y is in that dtype and already laid out token-major, as SDPA's
    flash kernels write it (CUDA's in the matmul dtype; a copy of the activations fewer per layer)
    and as one token's (decoding) always is."""
    B, H, T, hd = y.shape
    rows = y.transpose(1, 2)
    if y.dtype == dtype and rows.is_contiguous():
        return rows.view(B, T, H * hd)
    return torch.empty(B, T, H, hd, dtype=dtype, device=y.device).copy_(y.transpose(1, 2)).view(B, T, H * hd)


class FeedForward(nn.Module):
    # llama: SwiGLU, w2(silu(w1 x) * w3 x), hidden width from the 2/3*4d rule.
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.n_embd, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.n_embd, bias=False)
        self.w3 = nn.Linear(cfg.n_embd, cfg.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor, w13: torch.Tensor | None = None) -> torch.Tensor:
        """w13: w1|w3 already concatenated (PackedWeights), else concatenated here."""
        # w1 and w3 as one matmul (and one for their input gradient)
        w13 = torch.cat((self.w1.weight, self.w3.weight)) if w13 is None else w13
        return self.w2(swiglu(F.linear(x, w13)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout  # on both residual branches, in training only
        self.attention_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attention = Attention(cfg, dropout)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
        pending: torch.Tensor | None = None,
        defer: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the block's output, None); defer: (x, f), the residual stream past the attention branch
        and the feed-forward branch's output, not yet added: the next norm adds it, in its kernel
        on CUDA, taking it as `pending` (the previous block's f, added by this block's first norm)."""
        x, normed = self.attention_norm.after_add(x, pending)
        h = self.attention(normed, cos, sin, cache, layer)
        x, normed = self.ffn_norm.after_add(x, drop(h, self.dropout, self.training))
        packed = cache.packed if cache is not None and cache.position is not None else None
        w13 = packed.w13[layer] if packed is not None else None
        f = drop(self.feed_forward(normed, w13), self.dropout, self.training)
        return (x, f) if defer else (x + f, None)


class Llama(nn.Module):
    rope_cos: torch.Tensor  # (ctx, n_rot) buffers from rope_cache, registered in __init__
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, init_std: float | None = None, dropout: float = 0.0):
        """dropout (TrainConfig.dropout): the probability of dropping an element of the embedding
        output, the attention probabilities and both residual branches of every block, in training
        mode only. It is no part of the architecture (weights and exports are the same whatever it
        is), so it is no ModelConfig field."""
        super().__init__()
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.cfg = cfg
        self.dropout = dropout
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Block(cfg, dropout) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.output = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.activation_checkpointing = False
        self.graphed_blocks: GraphedBlocks | None = None  # training replays them (cuda_graphs)
        cos, sin = rope_cache(cfg, cfg.ctx)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights(default_init_std(cfg.n_embd) if init_std is None else init_std)

    def init_weights(self, std: float) -> None:
        """Normal(0, std) for every matrix and the embedding; GPT-2's residual projections (wo, w2)
        scaled by 1/sqrt(2 * n_layer); norms at 1."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.ones_(p)
            elif name.endswith("wo.weight") or name.endswith("w2.weight"):
                nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * self.cfg.n_layer))
            else:
                nn.init.normal_(p, mean=0.0, std=std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        reduction: Literal["mean", "sum"] = "mean",
        argmax: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx: (B, T) token ids. With targets (B, T): returns (logits, cross-entropy) over the targets
        that are not IGNORE_INDEX, their mean or (reduction="sum") their sum (the training step
        divides by the step's target count itself; a mean over no target would be NaN).
        argmax=True returns the logits' argmax (B, T) in their place, all a training step reads of
        them (token accuracy): then, where trainer.config.fused_loss says so, the loss runs fused with
        the output projection (trainer.model.linear_cross_entropy) and no (B*T, vocab) logits exist.
        With a cache: positions continue from cache.pos and the cache advances by T; the first call
        (the prefill) may pass many tokens, later calls one each (as trainer.sampling does)."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start > 0 and T > 1:  # SDPA's is_causal mask would not be offset by the cached prefix
            raise ValueError("with a KV cache, feed the prompt in one call, then one token per call")
        if start + T > self.cfg.ctx:
            raise ValueError(f"sequence of {start + T} tokens exceeds the context length ctx={self.cfg.ctx}")
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]
        x = drop(self.tok_embeddings(idx), self.dropout, self.training)
        if cache is not None:
            cache.visible = None
            if cache.position is not None:  # graphed decoding: the position is read on the device
                # float32 here, once, not in every layer's RoPE: a model cast to bf16 has bf16 tables
                cos = self.rope_cos.index_select(0, cache.position).float()
                sin = self.rope_sin.index_select(0, cache.position).float()
                cache.visible = self._visible_keys(cache.position, attention_dtype(x, self.cfg.head_dim))
        graphed = self.graphed_blocks
        pending = None  # the last block's feed-forward output, added by the final norm
        if graphed is not None and self.training and cache is None and graphed.fits(x):
            for step in graphed.steps:  # each block's CUDA graphs (trainer.model.graphed_blocks)
                x = step(x, cos, sin)
        else:
            x, pending = self._blocks(x, cos, sin, cache)
        if cache is not None:
            cache.pos += T
        x = self.norm.after_add(x, pending)[1]
        if targets is None:
            logits = self.output(x).float()
            return (logits.argmax(dim=-1) if argmax else logits), None
        if argmax and fused_applies(x):
            loss, predicted = linear_cross_entropy(
                x.flatten(0, 1), self.output.weight, targets.reshape(-1), IGNORE_INDEX, reduction
            )
            return predicted.view(B, T), loss
        logits = self.output(x).float()
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction=reduction,
        )
        return (logits.detach().argmax(dim=-1) if argmax else logits), loss

    def _blocks(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(x, f): the residual stream and the last block's feed-forward output where not yet added.
        Eager blocks hand theirs to the next block's first norm; a checkpointed block keeps x alone
        as its input, and a compiled one (regional compilation) adds its own: one compile serves
        every layer only while the calls pass the same kinds of arguments."""
        pending = None
        for i, layer in enumerate(self.layers):
            if self.activation_checkpointing and self.training and cache is None:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)[0]
            else:
                x, pending = layer(x, cos, sin, cache, i, pending, layer._compiled_call_impl is None)
        return x, pending

    def _visible_keys(self, position: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The mask (B, H, 1, ctx) of one new query at `position`: 0 for the keys up to it, -inf past.
        Additive, in attention's dtype: SDPA turns a boolean mask into this in every layer (two more
        kernels per layer in a decoding graph)."""
        positions = torch.arange(self.cfg.ctx, device=position.device)
        mask = torch.full((self.cfg.ctx,), float("-inf"), dtype=dtype, device=position.device)
        return mask.masked_fill_(positions <= position, 0.0).view(1, 1, 1, -1)

    def optimizer_groups(self, weight_decay: float, embedding_lr_scale: float = 1.0) -> list[dict[str, Any]]:
        """nanoGPT's rule: decay 2-D weights (matmuls), not norms. An untied token embedding gets a
        group of its own, at `lr_scale` times the schedule's rate and without decay: its rows move
        only when their token occurs, and a faster embedding reaches a given loss in fewer steps
        (a tied one is also the output projection and stays with the matrices)."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        embedding = None if self.cfg.tie_embeddings else params.pop("tok_embeddings.weight", None)
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if embedding is not None:
            groups.append({"params": [embedding], "weight_decay": 0.0, "lr_scale": embedding_lr_scale})
        return groups

    def flops_per_token(self) -> int:
        """Training FLOPs per token at full context: 6N for the weight matmuls plus 12*L*T*d for the
        attention scores, as PaLM (appendix B) and nanoGPT's estimate_mfu count them.

        The attention term: per layer and token, QK^T and AV each take 2*T*d FLOPs forward (d = the
        query heads' width n_head*head_dim = n_embd, also under GQA) and twice that backward, so
        3 * 2 * 2 * T * d. Like PaLM and nanoGPT it counts the whole T x T score matrix, not the causal
        half, so MFU figures compare with theirs. N leaves out the embedding lookup (not a matmul)
        but keeps the output projection, tied or not."""
        cfg = self.cfg
        n = self.num_params() - cfg.vocab_size * cfg.n_embd  # embedding lookup is not a matmul
        if cfg.tie_embeddings:
            n += cfg.vocab_size * cfg.n_embd  # the tied output projection still is
        attn = 12 * cfg.n_layer * cfg.ctx * cfg.n_head * cfg.head_dim
        return 6 * n + attn
