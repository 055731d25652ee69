"""Each export checked by its real consumer: llama.cpp (llama-cpp-python) for GGUF, transformers for
the Hugging Face folder, onnxruntime for ONNX.

Models are tiny (2 layers, d=64, GQA 4/2, ctx 64) and trained for a few dozen steps on a
repetitive text so greedy decoding follows the text (large logit margins, not random ties).
Three variants cover the matrix: byte tokenizer / untied / full RoPE, BPE / tied embeddings,
BPE / partial RoPE (rope_dims 8 of head dim 16). The consumers are imported inside the tests, so
a missing one fails its tests loudly instead of skipping them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.config import ModelConfig, TrainConfig
from trainer.data.tokenizers import ByteTokenizer, train_tokenizer
from trainer.export import ExportError, export, export_model
from trainer.export.gguf import permute_qk, rope_freq_factors
from trainer.model.fused_ops import apply_rope
from trainer.model.llama import Llama, rope_cache
from trainer.sampling import generate_ids

TEXT = (
    "Mary had a little lamb, its fleece was white as snow.\n"
    "And everywhere that Mary went, the lamb was sure to go.\n"
    "It followed her to school one day, which was against the rule.\n"
    "It made the children laugh and play to see a lamb at school.\n"
) * 12
PROMPT = "Mary had a little"
N_NEW = 40  # greedy tokens compared (the brief asks for at least 32)

VARIANTS = {
    "byte": dict(tokenizer="byte", tie_embeddings=False, rope_dims=None),
    "bpe_tied": dict(tokenizer="bpe", tie_embeddings=True, rope_dims=None),
    "bpe_partial_rope": dict(tokenizer="bpe", tie_embeddings=False, rope_dims=8),
}


@cache
def _bpe():
    return train_tokenizer("bpe", 320, [TEXT])


@cache
def trained(variant: str) -> tuple[ModelConfig, dict[str, torch.Tensor], object]:
    """(config, state dict, tokenizer) of a model trained briefly on TEXT; cached per variant."""
    v = VARIANTS[variant]
    tok = ByteTokenizer() if v["tokenizer"] == "byte" else _bpe()
    cfg = ModelConfig(
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=64,
        ctx=64,
        vocab_size=tok.vocab_size,
        rope_dims=v["rope_dims"],
        tie_embeddings=v["tie_embeddings"],
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Llama(cfg)
    data = torch.tensor(tok.encode(TEXT))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        starts = torch.randint(0, len(data) - cfg.ctx - 1, (8,), generator=gen)
        x = torch.stack([data[s : s + cfg.ctx] for s in starts])
        y = torch.stack([data[s + 1 : s + cfg.ctx + 1] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 2.0, f"tiny model did not learn the text (loss {loss.item():.2f})"
    return cfg, {k: v.detach().clone() for k, v in model.state_dict().items()}, tok


def our_model(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Llama:
    model = Llama(cfg)
    model.load_state_dict(state)
    return model.eval()


def our_greedy(variant: str) -> tuple[list[int], list[int]]:
    cfg, state, tok = trained(variant)
    ids = tok.encode(PROMPT)
    new = generate_ids(our_model(cfg, state), ids, max_new_tokens=N_NEW, temperature=0)
    assert len(new) == N_NEW and len(set(new)) > 5, f"degenerate greedy output {new}"
    return ids, new


@torch.no_grad()
def our_logits(variant: str, ids: list[list[int]]) -> np.ndarray:
    cfg, state, _ = trained(variant)
    return our_model(cfg, state)(torch.tensor(ids))[0].numpy()


# ------------------------------------------------------------------ RoPE conversion (pure torch)


@pytest.mark.parametrize("n_rot", [16, 8, 4])
def test_gguf_qk_permutation_matches_interleaved_rope(n_rot: int) -> None:
    """Our rotate_half RoPE on our rows == llama.cpp's adjacent-pair RoPE (with its rope_freqs
    divisors over the full head) on the permuted rows."""
    cfg = ModelConfig(n_head=2, n_kv_head=2, n_embd=32, ctx=16, rope_dims=n_rot, rope_theta=500.0)
    hd, T = cfg.head_dim, cfg.ctx
    torch.manual_seed(0)
    w = torch.randn(cfg.n_head * hd, cfg.n_embd, dtype=torch.float64)
    x = torch.randn(T, cfg.n_embd, dtype=torch.float64)
    cos, sin = rope_cache(cfg, T)
    ours = apply_rope((x @ w.T).view(T, cfg.n_head, hd).transpose(0, 1), cos.double(), sin.double())
    # ggml's "normal" RoPE: pair (2i, 2i+1) turned by pos * base^(-2i/n_dims) / factor[i], n_dims = hd.
    factors = rope_freq_factors(cfg)
    factors = (
        torch.ones(hd // 2, dtype=torch.float64) if factors is None else torch.from_numpy(factors).double()
    )
    theta = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd) / factors
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta  # (T, hd/2)
    q = (x @ permute_qk(w, cfg.n_head, hd, n_rot).T).view(T, cfg.n_head, hd).transpose(0, 1)
    a, b = q[..., 0::2], q[..., 1::2]
    turned = torch.stack(
        (a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()), dim=-1
    ).flatten(-2)
    # Same attention scores <q_s, k_t> need the same vectors up to one fixed per-head permutation.
    from trainer.export.gguf import meta_rope_permutation

    torch.testing.assert_close(
        turned, ours[..., meta_rope_permutation(hd, n_rot)], rtol=1e-5, atol=1e-4
    )  # cos/sin are fp32


# ------------------------------------------------------------------ GGUF in llama.cpp


def _llama_cpp(path: Path, n_ctx: int, vocab_only: bool = False):
    import llama_cpp  # the real consumer; must be installed (never skipped)

    # f32 KV cache: llama.cpp's default f16 cache alone moves logits by ~1e-2.
    return llama_cpp.Llama(
        str(path),
        n_ctx=n_ctx,
        logits_all=True,
        verbose=False,
        vocab_only=vocab_only,
        n_threads=1,
        type_k=0,
        type_v=0,
    )


def _llama_cpp_greedy(llm, prompt_ids: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    llm.reset()
    llm.eval(prompt_ids)
    out: list[int] = []
    rows = []
    for _ in range(n):
        logits = np.array(llm.scores[llm.n_tokens - 1])
        rows.append(logits)
        out.append(int(np.argmax(logits)))
        llm.eval([out[-1]])
    return out, rows


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gguf_f32_llama_cpp_greedy_decodes_our_tokens(variant: str, tmp_path: Path) -> None:
    cfg, state, tok = trained(variant)
    path = export_model(cfg, state, tok, "gguf", tmp_path / "model.gguf", "f32")
    llm = _llama_cpp(path, cfg.ctx)
    prompt_ids, ours = our_greedy(variant)
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=False) == prompt_ids
    theirs, rows = _llama_cpp_greedy(llm, prompt_ids, N_NEW)
    assert theirs == ours
    # And the logits themselves, along the decoded sequence.
    expected = our_logits(variant, [prompt_ids + ours])[0, len(prompt_ids) - 1 : len(prompt_ids) - 1 + N_NEW]
    assert np.abs(np.stack(rows) - expected).max() < 1e-3


FILE_TYPES = {"f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}


@pytest.mark.parametrize("dtype, tol", [("f16", 0.01), ("bf16", 0.01), ("q8_0", 0.05)])
def test_gguf_smaller_dtypes_load_with_close_logits(dtype: str, tol: float, tmp_path: Path) -> None:
    import gguf

    variant = "bpe_partial_rope"
    cfg, state, tok = trained(variant)
    path = export_model(cfg, state, tok, "gguf", tmp_path / f"model-{dtype}.gguf", dtype)
    f32_size = export_model(cfg, state, tok, "gguf", tmp_path / "model-f32.gguf", "f32").stat().st_size
    assert path.stat().st_size < 0.6 * f32_size
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType[FILE_TYPES[dtype]]
    assert reader.get_tensor(0).tensor_type.name == dtype.upper()  # token_embd, as asked
    llm = _llama_cpp(path, cfg.ctx)
    ids = tok.encode(TEXT[:200])[: cfg.ctx]
    llm.eval(ids)
    expected = our_logits(variant, [ids])[0]
    diff = np.abs(np.array(llm.scores[: len(ids)]) - expected).max()
    assert diff < tol * np.abs(expected).max(), f"{dtype} logits differ by {diff}"
    # Greedy choices agree almost everywhere (quantisation may flip a near-tie).
    agree = (np.array(llm.scores[: len(ids)]).argmax(-1) == expected.argmax(-1)).mean()
    assert agree > 0.9


@pytest.mark.parametrize("variant", ["byte", "bpe_tied"])
def test_gguf_tokenizer_matches_ours_on_hard_text(variant: str, tmp_path: Path) -> None:
    cfg, state, tok = trained(variant)
    path = export_model(cfg, state, tok, "gguf", tmp_path / "model.gguf", "f32")
    llm = _llama_cpp(path, cfg.ctx, vocab_only=True)
    for text in [
        "Mary's lamb, 1234 lambs! ",
        "naïve café — 日本語 🙂\n\n  two  spaces\ttab\n",
        "<s> stays text",
    ]:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text), text


def test_gguf_metadata_and_tensors(tmp_path: Path) -> None:
    import gguf

    cfg, state, tok = trained("bpe_tied")
    reader = gguf.GGUFReader(export_model(cfg, state, tok, "gguf", tmp_path / "m.gguf", "f16"))

    def value(key: str):
        field = reader.fields[key]
        return field.contents()

    assert value("general.architecture") == "llama"
    assert value("llama.context_length") == cfg.ctx
    assert value("llama.embedding_length") == cfg.n_embd
    assert value("llama.block_count") == cfg.n_layer
    assert value("llama.feed_forward_length") == cfg.hidden_dim
    assert value("llama.attention.head_count") == cfg.n_head
    assert value("llama.attention.head_count_kv") == cfg.n_kv_head
    assert value("llama.rope.dimension_count") == cfg.head_dim
    assert value("llama.vocab_size") == tok.vocab_size
    assert value("general.file_type") == 1
    assert value("tokenizer.ggml.model") == "gpt2"
    assert value("tokenizer.ggml.pre") == "gpt-2"
    assert value("tokenizer.ggml.add_bos_token") is False
    assert value("tokenizer.ggml.bos_token_id") == tok.bos_id
    assert value("tokenizer.ggml.eos_token_id") == tok.eos_id
    assert len(value("tokenizer.ggml.merges")) == len(tok.merges) > 0
    tensors = {t.name: t for t in reader.tensors}
    assert "output.weight" not in tensors  # tied: llama.cpp reuses token_embd
    assert "rope_freqs.weight" not in tensors  # full RoPE needs none
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert len(tensors) == 2 + 9 * cfg.n_layer


# ------------------------------------------------------------------ Hugging Face folder


@pytest.mark.parametrize("variant", ["byte", "bpe_tied"])
def test_hf_folder_in_transformers(variant: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg, state, tok = trained(variant)
    folder = export_model(cfg, state, tok, "hf", tmp_path / "hf", "f32")
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    hf_tok = AutoTokenizer.from_pretrained(folder)
    for text in [PROMPT, "naïve café — 日本語 🙂\n\n  two  spaces\ttab\n", "<s> stays text"]:
        assert hf_tok(text)["input_ids"] == tok.encode(text), text

    batch = [tok.encode(TEXT[:300])[: cfg.ctx], tok.encode(TEXT[100:400])[: cfg.ctx]]
    n = min(map(len, batch))
    batch = [b[:n] for b in batch]
    with torch.no_grad():
        theirs = model(torch.tensor(batch)).logits.numpy()
    assert np.abs(theirs - our_logits(variant, batch)).max() <= 1e-4

    prompt_ids, ours = our_greedy(variant)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=N_NEW, do_sample=False)
    assert out[0, len(prompt_ids) :].tolist() == ours


@pytest.mark.parametrize("dtype, torch_dtype", [("f16", "float16"), ("bf16", "bfloat16")])
def test_hf_half_folder_loads(dtype: str, torch_dtype: str, tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    cfg, state, tok = trained("byte")
    folder = export_model(cfg, state, tok, "hf", tmp_path / "hf16", dtype)
    assert json.loads((folder / "config.json").read_text())["dtype"] == torch_dtype
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in weights.keys()} == {getattr(torch, torch_dtype)}
    # as the file says (bf16 runs on CPU), and widened to f32
    for load_as in ("auto", torch.float32):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=load_as).eval()
        ids = [tok.encode(TEXT[: cfg.ctx])]
        with torch.no_grad():
            theirs = model(torch.tensor(ids)).logits.float().numpy()
        expected = our_logits("byte", ids)
        assert np.abs(theirs - expected).max() < 0.02 * np.abs(expected).max(), load_as


def test_hf_refuses_partial_rope(tmp_path: Path) -> None:
    cfg, state, tok = trained("bpe_partial_rope")
    with pytest.raises(ExportError, match="partial rotary"):
        export_model(cfg, state, tok, "hf", tmp_path / "hf", "f32")
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------ ONNX in onnxruntime


@pytest.mark.parametrize("variant", ["byte", "bpe_partial_rope"])
def test_onnx_in_onnxruntime(variant: str, tmp_path: Path) -> None:
    import onnxruntime
    from tokenizers import Tokenizer as HFTokenizer

    cfg, state, tok = trained(variant)
    path = export_model(cfg, state, tok, "onnx", tmp_path / "model.onnx", "f32")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids"]
    data = tok.encode(TEXT)
    for batch, seq in [(1, 1), (2, 13), (3, cfg.ctx)]:  # dynamic batch and sequence length
        ids = [data[i * 7 : i * 7 + seq] for i in range(batch)]
        (theirs,) = session.run(["logits"], {"input_ids": np.array(ids, dtype=np.int64)})
        assert theirs.shape == (batch, seq, cfg.vocab_size)
        assert np.abs(theirs - our_logits(variant, ids)).max() <= 1e-4
    # self-contained: the tokenizer (HF JSON), its special ids and the context length ride along
    meta = session.get_modelmeta().custom_metadata_map
    assert HFTokenizer.from_str(meta["tokenizer.json"]).encode(PROMPT + " 🙂\n").ids == tok.encode(
        PROMPT + " 🙂\n"
    )
    assert (meta["eos_token_id"], meta["context_length"]) == (str(tok.eos_id), str(cfg.ctx))


# ------------------------------------------------------------------ dispatcher and errors


def test_export_from_checkpoint_folder(tmp_path: Path) -> None:
    import gguf

    from trainer.checkpoint import save_checkpoint

    cfg, state, tok = trained("bpe_tied")
    ckpt = save_checkpoint(
        tmp_path / "ckpt",
        model=our_model(cfg, state),
        model_config=cfg,
        train_config=TrainConfig(tokenizer="bpe", vocab_size=tok.vocab_size),
        tokenizer=tok,
        state={"step": 60, "tokens_seen": 0, "best_val_loss": None, "sampler": {}, "total_steps": 60},
    )
    out = export(ckpt, "gguf", tmp_path / "out" / "model.gguf")
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.name"].contents() == "fromscratch-ckpt"
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]  # no temp file left behind
    folder = export(ckpt, "hf", tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True
    # Exporting again over our own folder replaces it.
    assert export(ckpt, "hf", tmp_path / "hf") == folder


def test_export_errors_name_the_problem(tmp_path: Path) -> None:
    cfg, state, tok = trained("byte")
    with pytest.raises(ExportError, match="unknown export format 'pt'"):
        export_model(cfg, state, tok, "pt", tmp_path / "x")
    with pytest.raises(ExportError, match="unknown export dtype 'int4'"):
        export_model(cfg, state, tok, "gguf", tmp_path / "x", "int4")
    with pytest.raises(ExportError, match="q8_0"):
        export_model(cfg, state, tok, "hf", tmp_path / "x", "q8_0")
    with pytest.raises(ExportError, match="f32 only"):
        export_model(cfg, state, tok, "onnx", tmp_path / "x.onnx", "f16")
    narrow = ModelConfig(n_layer=1, n_head=3, n_embd=48, ffn_dim=100, ctx=16, vocab_size=tok.vocab_size)
    with pytest.raises(ExportError, match="no matrix of this model has rows a multiple of 32"):  # all f16
        export_model(narrow, Llama(narrow).state_dict(), tok, "gguf", tmp_path / "x.gguf", "q8_0")
    bad = dict(state)
    bad["layers.1.attention.wk.weight"] = torch.zeros(3, 3)
    del bad["norm.weight"]
    with pytest.raises(
        ExportError, match=r"layers\.1\.attention\.wk\.weight has shape \(3, 3\).*|norm\.weight is missing"
    ):
        export_model(cfg, bad, tok, "gguf", tmp_path / "x.gguf")
    with pytest.raises(ExportError, match="vocab_size"):
        export_model(cfg, state, _bpe(), "gguf", tmp_path / "x.gguf")
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="holds other files"):
        export_model(cfg, state, tok, "hf", user_dir)
    assert (user_dir / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # nothing half-written left
