"""trainer.config.estimate against real runs on CPU: parameter, gradient and optimizer bytes exactly; the
activation estimate bounds what autograd saves (counted with saved_tensors_hooks) and the whole peak
bounds a real step's tensor memory (torch's MemTracker); steps, the parameter breakdown and the
validation hold-out follow the trainer's own model and data."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch

from tests.trainer.conftest import read_metrics
from trainer.config import ModelConfig, TrainConfig
from trainer.config.estimate import (
    estimate_memory,
    eval_tokens,
    evaluations,
    held_out_tokens,
    largest_fitting_batch_size,
    max_train_tokens,
    max_windows_per_epoch,
    parameter_breakdown,
    tokens_per_step,
    total_steps,
    total_tokens,
)
from trainer.data.formats import validate_file
from trainer.data.prepare import BatchSampler, prepare_data
from trainer.data.tokenizers import ByteTokenizer, train_tokenizer
from trainer.model.llama import Llama
from trainer.optim.optimizers import make_optimizer
from trainer.run.loop import train
from trainer.run.setup import total_steps_for

# small, but each exercising a different term: GQA, tied embeddings, partial RoPE, an explicit FFN
CONFIGS: dict[str, dict[str, Any]] = {
    "gqa": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ctx=64),
    "tied": dict(n_layer=1, n_head=2, n_embd=32, ctx=48, tie_embeddings=True),
    "rope-ffn": dict(n_layer=2, n_head=4, n_embd=64, ctx=32, rope_dims=8, ffn_dim=96),
}
BATCH = 3


def model_config(name: str) -> ModelConfig:
    return ModelConfig(vocab_size=258, **CONFIGS[name])


def batch(cfg: ModelConfig, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (size, cfg.ctx), generator=g)
    return x, torch.roll(x, -1, dims=1)


def autocast(train_cfg: TrainConfig) -> contextlib.AbstractContextManager[Any]:
    if train_cfg.dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def nbytes(tensors: Iterator[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, list):
                yield from (v for v in value if isinstance(v, torch.Tensor))


def one_step(model: Llama, optimizer: torch.optim.Optimizer, train_cfg: TrainConfig) -> None:
    x, y = batch(model.cfg)

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=False)
        with autocast(train_cfg):
            _, loss = model(x, y)
        assert loss is not None
        loss.backward()
        return loss

    optimizer.step(closure)  # type: ignore[arg-type]  # AdamW ignores the closure's result


@pytest.mark.parametrize("name", list(CONFIGS))
def test_weights_gradients_and_adamw_state_are_exact(name: str) -> None:
    model_cfg, train_cfg = model_config(name), TrainConfig(batch_size=BATCH)
    torch.manual_seed(0)
    model = Llama(model_cfg)
    optimizer = make_optimizer(model, train_cfg)
    one_step(model, optimizer, train_cfg)
    est = estimate_memory(model_cfg, train_cfg, "cpu")
    params = list(model.parameters())
    assert est.n_params == sum(p.numel() for p in params)
    assert est.weights == nbytes(iter(params)) + nbytes(model.buffers())
    assert est.gradients == nbytes(p.grad for p in params if p.grad is not None)
    assert est.optimizer == nbytes(optimizer_tensors(optimizer))


def part_of(name: str) -> str:
    """The ParameterBreakdown field a Llama parameter belongs to."""
    for marker, part in ((".attention.", "attention"), (".feed_forward.", "feed_forward"), ("norm", "norms")):
        if marker in name:
            return part
    return "embeddings"  # tok_embeddings, output


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_breakdown_matches_the_model(name: str) -> None:
    model_cfg = model_config(name)
    model = Llama(model_cfg)
    real = dict.fromkeys(("attention", "feed_forward", "norms", "embeddings"), 0)
    for param_name, p in model.named_parameters():
        real[part_of(param_name)] += p.numel()
    parts = parameter_breakdown(model_cfg)
    assert {k: getattr(parts, k) for k in real} == real
    assert parts.parameters == model_cfg.num_params() == sum(real.values())
    assert parts.rope_buffers == sum(b.numel() for b in model.buffers())


@pytest.mark.parametrize(("eval_every", "steps"), [(3, 10), (None, 25), (0, 5)])
def test_evaluations_are_the_trainers(
    tmp_path: Path,
    tiny_model: Any,
    tiny_train: Any,
    shakespeare_data: Any,
    byte_tokenizer: Any,
    eval_every,
    steps,
) -> None:
    """What admission counts (evaluations, and eval_tokens from them) is what a run does: every
    eval_every-th step and the last; auto decided from the steps."""
    cfg = tiny_train(max_steps=steps, eval_every=eval_every)
    train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    done = sum("val_loss" in m for m in read_metrics(tmp_path))
    assert evaluations(cfg, steps) == done == {3: 4, None: 3, 0: 0}[eval_every]
    assert eval_tokens(cfg, 32, steps) == done * cfg.eval_batches * cfg.batch_size * 32


def test_held_out_tokens_match_prepare_data(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 23)
    for fraction in (0.0, 0.05, 0.1, 0.37):
        data = prepare_data(text, ByteTokenizer(), val_fraction=fraction)
        n = len(data.train) + (0 if data.val is None else len(data.val))
        assert n - len(data.train) == held_out_tokens(n, fraction)
        # a text file's byte count bounds its byte tokens (exactly here: no BOS/EOS for plain text)
        cfg = TrainConfig(val_fraction=fraction)
        assert max_train_tokens(cfg, text.stat().st_size, has_validation_file=False) == len(data.train)
        assert max_train_tokens(cfg, text.stat().st_size, has_validation_file=True) == n


def test_a_files_token_bound_is_its_byte_tokens_and_bounds_bpe(tmp_path: Path) -> None:
    """validate_file's max_tokens (what admission sizes a job by): exact for byte tokens, an upper
    bound for BPE, and for JSONL well under the bytes (JSON syntax and escapes are not text)."""
    chat = [{"role": "system", "content": 'Be "brief".'}, {"role": "user", "content": "naïve café 🙂"}]
    records = [
        {"text": 'tab\there, a quote " and \\ é'},
        {"prompt": "Q: what boils?\nA:", "completion": " Water.\n", "extra": "not text"},
        {"messages": [*chat, {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]}]},
    ]
    jsonl = tmp_path / "mixed.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records * 5) + "\n\n")
    text = tmp_path / "plain.txt"
    text.write_text("naïve café 🙂\nline two\n" * 9)
    bpe = train_tokenizer("bpe", 300, [jsonl.read_text(), text.read_text()])
    for path in (jsonl, text):
        summary = validate_file(path)
        assert summary.max_tokens == len(prepare_data(path, ByteTokenizer(), val_fraction=0.0).train)
        assert len(prepare_data(path, bpe, val_fraction=0.0).train) <= summary.max_tokens
    assert validate_file(jsonl).max_tokens < 0.6 * validate_file(jsonl).n_bytes


def test_lbfgs_state_is_bounded() -> None:
    model_cfg, train_cfg = model_config("gqa"), TrainConfig(optimizer="lbfgs", batch_size=BATCH)
    torch.manual_seed(0)
    model = Llama(model_cfg)
    optimizer = make_optimizer(model, train_cfg)
    for _ in range(3):
        one_step(model, optimizer, train_cfg)
    assert 0 < nbytes(optimizer_tensors(optimizer)) <= estimate_memory(model_cfg, train_cfg, "cpu").optimizer


class SavedTensors:
    """Bytes autograd saves during a forward (each storage once; parameters and buffers are the
    model's, not activations), in total and per transformer block."""

    def __init__(self, model: Llama):
        self.owned = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
        self.seen: dict[int, tuple[int, int | None]] = {}  # storage -> (bytes, block index)
        self.block: int | None = None
        for i, layer in enumerate(model.layers):
            layer.register_forward_pre_hook(lambda *_, i=i: self._enter(i))
            layer.register_forward_hook(lambda *_: self._enter(None))

    def _enter(self, block: int | None) -> None:
        self.block = block

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.owned and ptr not in self.seen:
            self.seen[ptr] = (storage.nbytes(), self.block)
        return t

    @property
    def total(self) -> int:
        return sum(n for n, _ in self.seen.values())

    def largest_block(self) -> int:
        per_block: dict[int, int] = {}
        for n, block in self.seen.values():
            if block is not None:
                per_block[block] = per_block.get(block, 0) + n
        return max(per_block.values())


def saved_by_forward(model_cfg: ModelConfig, train_cfg: TrainConfig, checkpointing: bool) -> SavedTensors:
    torch.manual_seed(0)
    model = Llama(model_cfg, dropout=train_cfg.dropout or 0.0).train()
    model.activation_checkpointing = checkpointing
    saved = SavedTensors(model)
    x, y = batch(model_cfg)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t), autocast(train_cfg):
        model(x, y)
    return saved


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])  # on CPU, dropout saves the ctx x ctx attention
def test_activation_estimate_bounds_the_saved_tensors(
    name: str, dtype: Literal["float32", "bfloat16"], checkpointing: bool, dropout: float
) -> None:
    model_cfg = model_config(name)
    train_cfg = TrainConfig(
        batch_size=BATCH, dtype=dtype, activation_checkpointing=checkpointing, dropout=dropout
    )
    plain = saved_by_forward(model_cfg, train_cfg, checkpointing=False)
    if checkpointing:
        # the forward keeps each block's input; the backward recomputes one block at a time
        measured = saved_by_forward(model_cfg, train_cfg, checkpointing=True).total + plain.largest_block()
    else:
        measured = plain.total
    estimate = estimate_memory(model_cfg, train_cfg, "cpu").activations
    assert measured <= estimate
    assert estimate <= 1.6 * measured  # an upper bound, not a wild one


def test_whole_step_peak_is_bounded() -> None:
    """torch's MemTracker follows every tensor of a real step (forward, backward, clip, AdamW)."""
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    for name in CONFIGS:
        for extra in ({}, {"activation_checkpointing": True}, {"dtype": "bfloat16"}, {"dropout": 0.1}):
            model_cfg, train_cfg = model_config(name), TrainConfig(batch_size=BATCH, **extra)
            torch.manual_seed(0)
            model = Llama(model_cfg, dropout=train_cfg.dropout or 0.0).train()
            model.activation_checkpointing = train_cfg.activation_checkpointing
            optimizer = make_optimizer(model, train_cfg)
            x, y = batch(model_cfg)
            one_step(model, optimizer, train_cfg)  # the optimizer state exists before tracking starts
            tracker = mem_tracker.MemTracker()
            tracker.track_external(model, optimizer, x, y)
            with tracker:
                optimizer.zero_grad(set_to_none=True)
                with autocast(train_cfg):
                    _, loss = model(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            measured = sum(stats["Total"] for stats in tracker.get_tracker_snapshot("peak").values())
            est = estimate_memory(model_cfg, train_cfg, "cpu")
            assert measured <= est.training_peak - est.runtime, (name, extra)


def test_estimate_grows_with_the_batch_and_checkpointing_lowers_it() -> None:
    model_cfg = ModelConfig(n_layer=8, n_head=8, n_embd=512, ctx=1024, vocab_size=258)
    small = estimate_memory(model_cfg, TrainConfig(batch_size=1), "cpu")
    big = estimate_memory(model_cfg, TrainConfig(batch_size=64), "cpu")
    checkpointed = estimate_memory(
        model_cfg, TrainConfig(batch_size=64, activation_checkpointing=True), "cpu"
    )
    assert small.model_states == big.model_states and big.total > small.total
    assert checkpointed.activations < big.activations / 4
    limit = estimate_memory(model_cfg, TrainConfig(batch_size=10), "cpu").total
    assert largest_fitting_batch_size(model_cfg, TrainConfig(batch_size=64), "cpu", limit) == 10
    bf16 = estimate_memory(model_cfg, TrainConfig(batch_size=64), "cuda")  # auto: bf16 on CUDA
    assert bf16.dtype_bytes == 2 and bf16.activations < big.activations


@pytest.mark.parametrize("samples_after_nl", [False, True])
@pytest.mark.parametrize(("ctx", "batch_size", "grad_accum", "n_epochs"), [(16, 4, 1, 1), (7, 3, 2, 3)])
def test_epoch_steps_follow_the_trainer(
    samples_after_nl: bool, ctx: int, batch_size: int, grad_accum: int, n_epochs: int
) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 258, 1000).astype(np.uint16)
    tokens[rng.integers(0, 1000, 80)] = 10  # newlines
    cfg = TrainConfig(
        batch_size=batch_size, grad_accum=grad_accum, n_epochs=n_epochs, samples_after_nl=samples_after_nl
    )
    sampler = BatchSampler(
        tokens, ctx, batch_size * grad_accum, seed=0, samples_after_nl=samples_after_nl, epochs=n_epochs
    )
    bound = max_windows_per_epoch(len(tokens), ctx, samples_after_nl)
    if samples_after_nl:
        assert sampler.windows_per_epoch <= bound
    else:
        assert sampler.windows_per_epoch == bound
    steps = total_steps_for(cfg, sampler)
    assert steps == total_steps(cfg, sampler.windows_per_epoch) == sampler.steps_for_epochs(n_epochs)
    assert steps <= total_steps(cfg, bound)


def test_steps_and_tokens_without_epochs() -> None:
    assert total_steps(TrainConfig(max_steps=7, n_epochs=3), 10**9) == 7  # max_steps wins
    assert total_steps(TrainConfig(), 10**9) == 1000
    cfg = TrainConfig(max_steps=10, batch_size=4, grad_accum=2)
    assert total_tokens(cfg, 128, 10) == 10 * 4 * 2 * 128
    two = cfg.model_copy(update={"devices": 2})  # batch_size is per device
    assert tokens_per_step(two, 128) == 2 * tokens_per_step(cfg, 128) == 2 * 4 * 2 * 128
    assert total_tokens(two, 128, 10) == 10 * tokens_per_step(two, 128)
    assert math.isclose(total_tokens(cfg, 1, 1), 8)
