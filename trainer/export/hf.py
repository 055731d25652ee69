"""Hugging Face folder export: LlamaForCausalLM config + safetensors + a fast tokenizer.

Hugging Face's Llama uses the same rotate_half RoPE layout as our model, so weights are copied
as they are, only renamed. It rotates the whole head, though: `LlamaRotaryEmbedding` builds its
frequencies from head_dim and `apply_rotary_pos_emb` rotates every dim (partial_rotary_factor is
not read by Llama), so a model trained with rope_dims < head_dim cannot be expressed and is
refused rather than exported wrong.

Written files: config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint_snapshot import write_safetensors
from trainer.config import ModelConfig
from trainer.data.chat import JINJA_CHAT_TEMPLATE
from trainer.data.tokenizers import BPETokenizer, Tokenizer, bytes_to_unicode
from trainer.export.common import ExportError, write_atomically

BOS_TOKEN, EOS_TOKEN = "<s>", "</s>"


def hf_state_dict(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our parameter names -> transformers' LlamaForCausalLM names (lm_head omitted when tied)."""
    out = {"model.embed_tokens.weight": state["tok_embeddings.weight"]}
    names = {
        "attention_norm.weight": "input_layernorm.weight",
        "attention.wq.weight": "self_attn.q_proj.weight",
        "attention.wk.weight": "self_attn.k_proj.weight",
        "attention.wv.weight": "self_attn.v_proj.weight",
        "attention.wo.weight": "self_attn.o_proj.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "feed_forward.w1.weight": "mlp.gate_proj.weight",
        "feed_forward.w3.weight": "mlp.up_proj.weight",
        "feed_forward.w2.weight": "mlp.down_proj.weight",
    }
    for i in range(cfg.n_layer):
        for ours, theirs in names.items():
            out[f"model.layers.{i}.{theirs}"] = state[f"layers.{i}.{ours}"]
    out["model.norm.weight"] = state["norm.weight"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["output.weight"]
    return out


def hf_config(cfg: ModelConfig, tokenizer: Tokenizer, torch_dtype: str) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.ctx,
        "rms_norm_eps": cfg.norm_eps,
        # transformers >= 5 reads rope_parameters; older releases read the top-level rope_theta.
        "rope_parameters": rope,
        "rope_theta": float(cfg.rope_theta),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "use_cache": True,
        "dtype": torch_dtype,
        "torch_dtype": torch_dtype,  # the pre-5 name of the same field
    }


def hf_tokenizer_json(tokenizer: Tokenizer) -> str:
    """The HF `tokenizers` JSON: the BPE's own (it is one), or for bytes a BPE over the 256
    byte-to-unicode symbols with no merges, so every byte is one token with id = byte value."""
    if isinstance(tokenizer, BPETokenizer):  # the only tokenizer of kind "bpe"
        return tokenizer.hf_tokenizer.to_str()
    if tokenizer.kind != "byte":
        raise ExportError(f"Hugging Face export does not know tokenizer kind {tokenizer.kind!r}")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab[BOS_TOKEN], vocab[EOS_TOKEN] = tokenizer.bos_id, tokenizer.eos_id
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([BOS_TOKEN, EOS_TOKEN])  # already in the vocab: keeps ids 256/257
    return hf.to_str()


def write_hf(
    cfg: ModelConfig, state: dict[str, torch.Tensor], tokenizer: Tokenizer, out: Path, dtype: str
) -> Path:
    if cfg.n_rot != cfg.head_dim:
        raise ExportError(
            f"the Hugging Face export cannot express partial rotary embeddings (rope_dims={cfg.n_rot} < "
            f"head dim {cfg.head_dim}): transformers' Llama rotates the whole head. Export as gguf or onnx, "
            "or train with rope_dims unset"
        )
    torch_dtype = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]
    tensors = {
        k: v.to(getattr(torch, torch_dtype)).contiguous() for k, v in hf_state_dict(cfg, state).items()
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "add_bos_token": False,  # our models are trained without a leading BOS
        "add_eos_token": False,
        "model_max_length": cfg.ctx,
        "clean_up_tokenization_spaces": False,
        # Literal "<s>" in text stays text, as in our tokenizer (it never yields BOS from text).
        "split_special_tokens": True,
        "chat_template": JINJA_CHAT_TEMPLATE,  # the format /v1/chat/completions prompts with
    }
    generation_config = {
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.eos_id,
    }

    def write(tmp: Path) -> None:
        # not safetensors' save_file: it creates the file 0600, where every other file follows the umask
        write_safetensors(tensors, tmp / "model.safetensors")
        _dump(tmp / "config.json", hf_config(cfg, tokenizer, torch_dtype))
        _dump(tmp / "generation_config.json", generation_config)
        (tmp / "tokenizer.json").write_text(hf_tokenizer_json(tokenizer))
        _dump(tmp / "tokenizer_config.json", tokenizer_config)
        _dump(
            tmp / "special_tokens_map.json",
            {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN},
        )

    return write_atomically(out, write, folder=True)


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
