"""GGUF export for llama.cpp (arch `llama`), tokenizer embedded.

Facts this relies on (from llama.cpp's loader and gguf-py):
- Tensors use llama.cpp names (token_embd, blk.N.attn_q, ...); a 2-D torch weight (out, in) is
  written as it is (GGUF lists dims innermost first, so it reads as {in, out}).
- llama.cpp's `llama` arch rotates adjacent pairs (2i, 2i+1) of each head with frequency i (Meta's
  layout). Our model pairs dim i with i + n_rot/2 (rotate_half), so the rows of wq/wk are permuted
  within each head: new row 2i = old row i, new row 2i+1 = old row i + n_rot/2.
- The `llama` arch refuses rope.dimension_count != head dim ("invalid n_rot"). Partial rotary
  (rope_dims < head_dim) is therefore written as full-head RoPE plus a `rope_freqs` tensor (the
  per-pair frequency divisor llama.cpp applies, as for Llama 3.1): the first n_rot/2 pairs get the
  divisor that turns the head-dim frequency into ours, the others a huge one so their angle is 0,
  i.e. those dims pass through unrotated, as in our model.
- Without `output.weight` llama.cpp reuses token_embd for the output projection (tied embeddings).
- The vocabulary is a `gpt2` (byte-level BPE) one: token strings in GPT-2's byte-to-unicode form.
  llama.cpp refuses an empty merges list, so the byte tokenizer gets one merge ("ÿ ÿ", bytes
  0xFF 0xFF) that valid UTF-8 never contains; it then maps text to bytes one to one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from trainer.config import ModelConfig
from trainer.data.chat import JINJA_CHAT_TEMPLATE
from trainer.data.tokenizers import BPETokenizer, Tokenizer, bytes_to_unicode
from trainer.export.common import ExportError, write_atomically

if TYPE_CHECKING:  # gguf is imported only when this export runs
    from gguf import GGMLQuantizationType, GGUFWriter

# Divisor for rotary pairs that must not rotate: angle = pos * freq / 1e30 is 0 for any real context.
NO_ROTATION = 1e30

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5  # llama.cpp's token types


def meta_rope_permutation(head_dim: int, n_rot: int) -> torch.Tensor:
    """Index per head: GGUF row j takes our row perm[j] (pairs interleaved, unrotated dims kept)."""
    half = n_rot // 2
    interleaved = [src for i in range(half) for src in (i, i + half)]
    return torch.tensor(interleaved + list(range(n_rot, head_dim)))


def permute_qk(w: torch.Tensor, n_heads: int, head_dim: int, n_rot: int) -> torch.Tensor:
    """Rows of wq/wk (n_heads*head_dim, in) from our rotate_half layout to Meta's pair layout."""
    perm = meta_rope_permutation(head_dim, n_rot)
    return w.view(n_heads, head_dim, -1)[:, perm, :].reshape(w.shape)


def rope_freq_factors(cfg: ModelConfig) -> np.ndarray | None:
    """llama.cpp's rope_freqs tensor (head_dim/2 divisors) for partial rotary; None when not needed.

    llama.cpp rotates pair i by pos * base^(-2i/head_dim) / factor[i]; ours by pos * base^(-2i/n_rot)."""
    if cfg.n_rot == cfg.head_dim:
        return None
    i = np.arange(cfg.head_dim // 2, dtype=np.float64)
    factors = np.full(cfg.head_dim // 2, NO_ROTATION)
    used = i < cfg.n_rot // 2
    factors[used] = cfg.rope_theta ** (2 * i[used] / cfg.n_rot - 2 * i[used] / cfg.head_dim)
    return factors.astype(np.float32)


def gguf_vocab(tokenizer: Tokenizer) -> tuple[list[str], list[int], list[str]]:
    """(token strings, token types, merges) in llama.cpp's `gpt2` vocabulary form."""
    b2u = bytes_to_unicode()
    specials = {tokenizer.bos_id: "<s>", tokenizer.eos_id: "</s>"}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(tokenizer.vocab_size):
        raw = tokenizer.token_bytes(i)
        if i in specials:
            tokens.append(specials[i])
            types.append(TOKEN_CONTROL)
        elif raw:
            tokens.append("".join(b2u[b] for b in raw))
            types.append(TOKEN_NORMAL)
        else:  # an id with no bytes that is not BOS/EOS: keep the slot, never produced by text
            tokens.append(f"<unused{i}>")
            types.append(TOKEN_UNUSED)
    if isinstance(tokenizer, BPETokenizer):  # the only tokenizer of kind "bpe"
        merges = [f"{a} {b}" for a, b in tokenizer.merges]
    elif tokenizer.kind == "byte":
        merges = [f"{b2u[0xFF]} {b2u[0xFF]}"]
    else:
        raise ExportError(f"GGUF export does not know tokenizer kind {tokenizer.kind!r}")
    if not merges:  # a BPE that learned nothing: same trick as for bytes
        merges = [f"{b2u[0xFF]} {b2u[0xFF]}"]
    return tokens, types, merges


def gguf_tensors(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """fp32 numpy tensors under llama.cpp names, Q/K permuted for Meta's RoPE layout."""
    hd, n_rot = cfg.head_dim, cfg.n_rot
    out = {"token_embd.weight": state["tok_embeddings.weight"]}
    for i in range(cfg.n_layer):
        p, b = f"layers.{i}.", f"blk.{i}."
        out |= {
            b + "attn_norm.weight": state[p + "attention_norm.weight"],
            b + "attn_q.weight": permute_qk(state[p + "attention.wq.weight"], cfg.n_head, hd, n_rot),
            b + "attn_k.weight": permute_qk(state[p + "attention.wk.weight"], cfg.kv_heads, hd, n_rot),
            b + "attn_v.weight": state[p + "attention.wv.weight"],
            b + "attn_output.weight": state[p + "attention.wo.weight"],
            b + "ffn_norm.weight": state[p + "ffn_norm.weight"],
            b + "ffn_gate.weight": state[p + "feed_forward.w1.weight"],
            b + "ffn_down.weight": state[p + "feed_forward.w2.weight"],
            b + "ffn_up.weight": state[p + "feed_forward.w3.weight"],
        }
    out["output_norm.weight"] = state["norm.weight"]
    if not cfg.tie_embeddings:
        out["output.weight"] = state["output.weight"]
    arrays = {k: v.numpy().astype(np.float32) for k, v in out.items()}
    factors = rope_freq_factors(cfg)
    if factors is not None:
        arrays["rope_freqs.weight"] = factors
    return arrays


def write_gguf(
    cfg: ModelConfig, state: dict[str, torch.Tensor], tokenizer: Tokenizer, out: Path, dtype: str, name: str
) -> Path:
    import gguf  # lazy: only this export needs it

    file_types = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    tensors = gguf_tensors(cfg, state)
    if dtype == "q8_0" and not any(
        _tensor_type(k, a, dtype) == gguf.GGMLQuantizationType.Q8_0 for k, a in tensors.items()
    ):
        # every matrix would fall back to f16: a "q8_0" file that is an f16 one
        raise ExportError(
            "q8_0 quantizes rows in blocks of 32 values, and no matrix of this model has rows a multiple "
            f"of 32 (n_embd {cfg.n_embd}, ffn {cfg.hidden_dim}): export as f16, which is what q8_0 would write"
        )

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_type("model")
        w.add_name(name)
        w.add_file_type(file_types[dtype])
        if dtype == "q8_0":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_vocab_size(cfg.vocab_size)
        w.add_context_length(cfg.ctx)
        w.add_embedding_length(cfg.n_embd)
        w.add_block_count(cfg.n_layer)
        w.add_feed_forward_length(cfg.hidden_dim)
        w.add_head_count(cfg.n_head)
        w.add_head_count_kv(cfg.kv_heads)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_layer_norm_rms_eps(cfg.norm_eps)
        # Always the full head: llama.cpp's llama arch accepts nothing else (see module docstring).
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_rope_freq_base(cfg.rope_theta)

        _add_tokenizer(w, tokenizer)

        for key, arr in tensors.items():
            qtype = _tensor_type(key, arr, dtype)
            if qtype == gguf.GGMLQuantizationType.F32:
                w.add_tensor(key, arr)
            elif qtype == gguf.GGMLQuantizationType.F16:
                w.add_tensor(key, arr.astype(np.float16))
            else:
                w.add_tensor(key, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return write_atomically(out, write)


def _add_tokenizer(w: GGUFWriter, tokenizer: Tokenizer) -> None:
    tokens, token_types, merges = gguf_vocab(tokenizer)
    w.add_tokenizer_model("gpt2")
    # Our BPE pre-tokenizes with GPT-2's regex (HF ByteLevel, no prefix space): llama.cpp's "gpt-2".
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.bos_id)
    w.add_eos_token_id(tokenizer.eos_id)
    w.add_add_bos_token(False)  # we never prepend BOS to a prompt
    w.add_add_eos_token(False)
    w.add_chat_template(JINJA_CHAT_TEMPLATE)  # the service's chat format (llama.cpp's --jinja)


def _tensor_type(key: str, arr: np.ndarray, dtype: str) -> GGMLQuantizationType:
    """Norms and rope_freqs stay f32 (as llama.cpp's converter keeps 1-D tensors); q8_0 needs rows
    that are a multiple of its 32-value block, other matrices fall back to f16 (as llama.cpp does);
    bf16 takes every matrix."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    if dtype == "f32" or arr.ndim < 2:
        return T.F32
    if dtype == "bf16":
        return T.BF16
    if dtype == "q8_0" and arr.shape[-1] % GGML_QUANT_SIZES[T.Q8_0][0] == 0:
        return T.Q8_0
    return T.F16
