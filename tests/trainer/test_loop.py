"""The training loop, optimisers and schedules: it learns, it is split-invariant, it reports and stops."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.trainer.conftest import read_metrics, train_losses
from trainer.config import TrainConfig
from trainer.config.metrics import EvalMetrics, FullEvalMetrics, StepMetrics
from trainer.data.formats import DataError
from trainer.data.prepare import TokenData
from trainer.optim.optimizers import lr_at, make_optimizer
from trainer.run.loop import train
from trainer.run.memory import peak_memory_bytes
from trainer.run.report import Callbacks, TrainingDiverged


class Recorder(Callbacks):
    def __init__(self, stop_at: int | None = None, request: str = "pause"):
        self.started: dict | None = None
        self.steps: list[tuple] = []
        self.evals: list[tuple[int, float]] = []
        self.checkpoints: list[tuple[int, Path]] = []
        self.accuracies: list[float | None] = []
        self.val_accuracies: list[float | None] = []
        self.full_evals: list[tuple[int, float, float]] = []
        self.stop_at, self.request = stop_at, request

    def on_start(self, info: dict) -> None:
        self.started = info

    def on_step(self, metrics: StepMetrics) -> None:
        m = metrics
        self.steps.append((m.step, m.train_loss, m.lr, m.grad_norm, m.tokens_per_s, m.tokens_seen))
        self.accuracies.append(m.train_accuracy)

    def on_eval(self, metrics: EvalMetrics) -> None:
        self.evals.append((metrics.step, metrics.val_loss))
        self.val_accuracies.append(metrics.val_accuracy)

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        self.full_evals.append(
            (metrics.step, metrics.full_valid_loss, metrics.full_valid_mean_token_accuracy)
        )

    def on_checkpoint(self, step, path) -> None:
        assert (path / "state.json").exists()  # complete when reported
        self.checkpoints.append((step, path))

    def should_stop(self):
        if self.stop_at is not None and self.steps and self.steps[-1][0] >= self.stop_at:
            return self.request
        return None


# ---------------------------------------------------------------- learning


def test_overfits_one_batch(tmp_path, tiny_model, tiny_train, byte_tokenizer):
    # ctx+1 tokens hold exactly one window, so every batch is the same sequence.
    tokens = np.random.default_rng(0).integers(0, 256, size=33).astype(np.uint16)
    result = train(
        tiny_model(n_embd=64, n_head=4),
        tiny_train(max_steps=150, schedule="constant", learning_rate=1e-2, weight_decay=0.0),
        TokenData(tokens, None),
        tmp_path,
        tokenizer=byte_tokenizer,
    )
    losses = train_losses(tmp_path)
    assert losses[0] > 5.0  # ~ln(258) at init
    assert result.last_train_loss < 0.05


def test_shakespeare_val_loss_beats_unigram_entropy(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    # the unigram entropy: the loss of the best model that ignores context (~3.3 nats for English bytes)
    p = np.bincount(np.asarray(shakespeare_data.train, dtype=np.int64)) / len(shakespeare_data.train)
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    cfg = tiny_train(max_steps=200, batch_size=16, eval_every=100, eval_batches=8, warmup_steps=20)
    rec = Recorder()
    result = train(
        tiny_model(n_layer=2, n_head=4, n_embd=64, ctx=64),
        cfg,
        shakespeare_data,
        tmp_path,
        rec,
        tokenizer=byte_tokenizer,
    )
    assert [s for s, _ in rec.evals] == [100, 200]
    assert result.last_val_loss < entropy - 0.8, (result.last_val_loss, entropy)
    assert result.best_val_loss == min(v for _, v in rec.evals)


@pytest.mark.parametrize("batch_size,grad_accum", [(4, 2), (2, 4)])
def test_grad_accum_matches_one_big_batch(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer, batch_size, grad_accum
):
    def run(out: Path, b: int, k: int) -> list[float]:
        train(
            tiny_model(),
            tiny_train(max_steps=20, batch_size=b, grad_accum=k),
            shakespeare_data,
            out,
            tokenizer=byte_tokenizer,
        )
        return train_losses(out)

    reference = run(tmp_path / "8x1", 8, 1)
    split = run(tmp_path / f"{batch_size}x{grad_accum}", batch_size, grad_accum)
    assert len(reference) == len(split) == 20
    np.testing.assert_allclose(split, reference, rtol=1e-4)
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "8x1" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / f"{batch_size}x{grad_accum}" / "final" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- reporting


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_peak_memory_is_the_runs_not_the_worker_process(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    """A training worker runs job after job in one process: a small job after a big one reports its
    own peak, not the big one's."""
    big = np.ones(400 * 2**20 // 8)  # 400 MiB, every page touched
    process_peak = peak_memory_bytes(torch.device("cpu"))
    assert process_peak is not None and process_peak > big.nbytes
    del big
    train(tiny_model(), tiny_train(max_steps=2), shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    peaks = [m["peak_memory_bytes"] for m in read_metrics(tmp_path) if "train_loss" in m]
    assert len(peaks) == 2 and max(peaks) < process_peak - 300 * 2**20


def test_the_peak_memory_reported_never_falls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux's VmHWM can read a page lower than a moment before (its high-water mark is brought up
    to date lazily); the run reports the highest reading."""
    from trainer.run import memory

    readings = iter([100.0, 4196.0, 4192.0, 5000.0])
    monkeypatch.setattr(memory, "peak_memory_bytes", lambda device: next(readings))
    peak = memory.PeakMemory(torch.device("cpu"))
    assert [peak.read() for _ in range(4)] == [100.0, 4196.0, 4196.0, 5000.0]


def test_metrics_callbacks_and_outputs(tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer):
    rec = Recorder()
    cfg = tiny_train(max_steps=6, log_every=2, eval_every=3, checkpoint_every=2, keep_checkpoints=5)
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path, rec, tokenizer=byte_tokenizer)
    assert rec.started == {
        "total_steps": 6,
        "start_step": 0,
        "n_params": rec.started["n_params"],
        "tokens_per_step": 4 * 32,
        "device": "cpu",
        "dtype": "float32",
        "processes": 1,
        "dtype_reason": rec.started["dtype_reason"],  # this machine's (tests/trainer/test_precision.py)
        "compile": False,  # auto: eager until it has timed the first steps (test_compile_auto.py)
        "compile_reason": rec.started["compile_reason"],
        "kernels": rec.started["kernels"],
        "auto": [],  # tiny_train sets every data-aware field (tests/trainer/test_data_aware.py)
        "notes": [],
        "train_tokens": rec.started["train_tokens"],
        "val_tokens": rec.started["val_tokens"],
    }
    assert rec.started["train_tokens"] > 0 and rec.started["val_tokens"] > 0
    assert rec.started["compile_reason"].startswith("auto: decided after timing the first ")
    assert rec.started["kernels"].startswith("fused C kernels (")  # tests/trainer/test_cpu_kernels.py
    assert [s[0] for s in rec.steps] == [2, 4, 6]
    assert [s[5] for s in rec.steps] == [256, 512, 768]
    assert [s for s, _ in rec.evals] == [3, 6]
    assert [s for s, _ in rec.checkpoints] == [2, 4]  # the last step goes to final/, not a step folder
    metrics = read_metrics(tmp_path)
    step_lines = [m for m in metrics if "train_loss" in m]
    assert {"step", "train_loss", "lr", "grad_norm", "tokens_per_s", "tokens_seen", "time"} <= set(
        step_lines[0]
    )
    # the run's peak memory so far (CPU: the process's peak RSS since the run started), so it never falls
    peaks = [m["peak_memory_bytes"] for m in step_lines]
    assert peaks == sorted(peaks) and peaks[0] > 2**20
    eval_lines = [m for m in metrics if "val_loss" in m]
    assert [m["step"] for m in eval_lines] == [3, 6]
    assert eval_lines[-1]["val_ppl"] == pytest.approx(math.exp(eval_lines[-1]["val_loss"]))
    assert result.stop_reason == "completed" and result.step == 6 and result.tokens_seen == 6 * 128
    assert result.final_checkpoint == tmp_path / "final"
    assert (tmp_path / "final" / "state.json").exists() and (tmp_path / "best" / "state.json").exists()
    assert step_lines[-1]["lr"] == pytest.approx(lr_at(5, cfg, 6))


def test_eval_is_deterministic_and_leaves_training_alone(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    # same run with and without evaluations: identical training losses
    train(tiny_model(), tiny_train(max_steps=6), shakespeare_data, tmp_path / "a", tokenizer=byte_tokenizer)
    train(
        tiny_model(),
        tiny_train(max_steps=6, eval_every=1),
        shakespeare_data,
        tmp_path / "b",
        tokenizer=byte_tokenizer,
    )
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b")


@pytest.mark.parametrize("request_", ["pause", "stop"])
def test_should_stop_writes_checkpoint_and_returns(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer, request_
):
    rec = Recorder(stop_at=3, request=request_)
    result = train(
        tiny_model(), tiny_train(max_steps=50), shakespeare_data, tmp_path, rec, tokenizer=byte_tokenizer
    )
    assert result.stop_reason == request_ and result.step == 3
    assert result.final_checkpoint == tmp_path / "checkpoints" / "step-00000003"
    assert rec.checkpoints == [(3, result.final_checkpoint)]
    assert not (tmp_path / "final").exists()


def test_a_stop_asked_during_an_evaluation_drops_it_and_a_pause_lets_it_finish(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    """An evaluation of 10,000 batches asks before each whether the run is being stopped: the stop
    (a cancel) asked at step 2 ends it there without its evaluation, not after an hour of batches. A
    pause lets it finish: the run resumed from the pause has every evaluation a straight one has."""
    rec = Recorder(stop_at=2, request="stop")
    cfg = tiny_train(max_steps=50, eval_every=2, eval_batches=10_000)
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path / "a", rec, tokenizer=byte_tokenizer)
    assert result.stop_reason == "stop" and result.step == 2 and rec.evals == []
    assert not any("val_loss" in m for m in read_metrics(tmp_path / "a"))
    rec = Recorder(stop_at=2, request="pause")
    cfg = tiny_train(max_steps=50, eval_every=2, eval_batches=3)
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path / "b", rec, tokenizer=byte_tokenizer)
    assert result.stop_reason == "pause" and [step for step, _ in rec.evals] == [2]


def test_time_limit_stops_with_checkpoint(tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer):
    result = train(
        tiny_model(),
        tiny_train(max_steps=10_000, time_limit=1e-6),
        shakespeare_data,
        tmp_path,
        tokenizer=byte_tokenizer,
    )
    assert result.stop_reason == "time_limit" and result.step < 10_000
    assert (result.final_checkpoint / "state.json").exists()


def test_nan_loss_raises_training_diverged(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer, monkeypatch
):
    # A loss that turns NaN from the 4th forward pass on (as an overflowing run's would).
    import torch.nn.functional as F

    real_cross_entropy = F.cross_entropy
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real_cross_entropy(*args, **kwargs)
        return loss * float("nan") if calls["n"] >= 4 else loss

    monkeypatch.setattr(F, "cross_entropy", poisoned)
    cfg = tiny_train(max_steps=20, eval_every=0, warmup_steps=0, schedule="constant")
    with pytest.raises(TrainingDiverged, match="diverged at step 4"):
        train(tiny_model(), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)


def test_too_short_data_fails_before_training(tmp_path, tiny_model, tiny_train):
    data = tmp_path / "short.txt"
    data.write_text("too short for ctx 32")
    with pytest.raises(DataError, match="ctx"):
        train(tiny_model(), tiny_train(), data, tmp_path / "out")
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_trains_from_a_file_with_its_own_tokenizer(tmp_path, tiny_model, tiny_train, shakespeare):
    result = train(
        tiny_model(), tiny_train(max_steps=2, tokenizer="bpe", vocab_size=300), shakespeare, tmp_path
    )
    from trainer.checkpoint import load_checkpoint

    ckpt = load_checkpoint(result.final_checkpoint)
    assert ckpt.tokenizer.kind == "bpe" and ckpt.tokenizer.vocab_size == 300
    assert ckpt.model_config.vocab_size == 300
    assert ckpt.model_state["tok_embeddings.weight"].shape == (300, 32)


def test_n_epochs_sets_total_steps(tmp_path, tiny_model, tiny_train, byte_tokenizer):
    tokens = np.arange(32 * 20 + 1, dtype=np.uint16) % 256  # 20 windows of ctx 32 per epoch
    rec = Recorder()
    train(
        tiny_model(),
        tiny_train(max_steps=None, n_epochs=2, batch_size=4),
        TokenData(tokens, None),
        tmp_path,
        rec,
        tokenizer=byte_tokenizer,
    )
    assert rec.started["total_steps"] == 10


def test_refuses_to_overwrite_a_run(tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer):
    train(tiny_model(), tiny_train(max_steps=2), shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    with pytest.raises(FileExistsError, match="resume"):
        train(tiny_model(), tiny_train(max_steps=2), shakespeare_data, tmp_path, tokenizer=byte_tokenizer)


def test_init_from_starts_fresh_with_the_weights(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    first = train(
        tiny_model(n_embd=48, n_head=4),
        tiny_train(max_steps=3),
        shakespeare_data,
        tmp_path / "a",
        tokenizer=byte_tokenizer,
    )
    rec = Recorder()
    # the architecture and the tokenizer come from the checkpoint, not from the (different) configs
    # passed in, and the run's config says so
    train(
        tiny_model(),
        tiny_train(max_steps=2, tokenizer="bpe", vocab_size=300),
        shakespeare_data,
        tmp_path / "b",
        rec,
        tokenizer=byte_tokenizer,
        init_from=first.final_checkpoint,
    )
    assert rec.started["start_step"] == 0
    from trainer.checkpoint import load_checkpoint

    continued = load_checkpoint(tmp_path / "b" / "final")
    assert continued.model_config.n_embd == 48 and continued.tokenizer.kind == "byte"
    assert (continued.train_config.tokenizer, continued.train_config.vocab_size) == ("byte", None)


# ---------------------------------------------------------------- precision / options


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_on_cpu(tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer, dtype):
    rec = Recorder()
    result = train(
        tiny_model(),
        tiny_train(max_steps=4, dtype=dtype),
        shakespeare_data,
        tmp_path,
        rec,
        tokenizer=byte_tokenizer,
    )
    assert rec.started["dtype"] == dtype
    assert math.isfinite(result.last_train_loss)
    from safetensors.torch import load_file

    assert all(
        t.dtype == torch.float32 for t in load_file(str(tmp_path / "final" / "model.safetensors")).values()
    )


def test_activation_checkpointing_gives_the_same_losses(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    train(tiny_model(), tiny_train(max_steps=4), shakespeare_data, tmp_path / "a", tokenizer=byte_tokenizer)
    train(
        tiny_model(),
        tiny_train(max_steps=4, activation_checkpointing=True),
        shakespeare_data,
        tmp_path / "b",
        tokenizer=byte_tokenizer,
    )
    np.testing.assert_allclose(train_losses(tmp_path / "b"), train_losses(tmp_path / "a"), rtol=1e-5)


def test_lbfgs_reduces_the_loss(tmp_path, tiny_model, tiny_train, byte_tokenizer):
    tokens = np.random.default_rng(1).integers(0, 256, size=33).astype(np.uint16)
    result = train(
        tiny_model(),
        tiny_train(max_steps=15, optimizer="lbfgs", learning_rate=1.0),
        TokenData(tokens, None),
        tmp_path,
        tokenizer=byte_tokenizer,
    )
    losses = train_losses(tmp_path)
    assert result.last_train_loss < losses[0] - 1.0


def test_adamw_decays_only_matrices_and_runs_the_embedding_at_its_own_rate(tiny_model):
    from trainer.model.llama import Llama
    from trainer.optim.optimizers import set_lr

    model = Llama(tiny_model())
    cfg = TrainConfig(weight_decay=0.1, beta1=0.8, beta2=0.9, eps=1e-6, embedding_lr_scale=4.0)
    opt = make_optimizer(model, cfg)
    assert type(opt).__name__ == "AdamW" and opt.defaults["fused"] is True
    decay, no_decay, embedding = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert decay["betas"] == (0.8, 0.9) and decay["eps"] == 1e-6
    assert embedding["params"] == [model.tok_embeddings.weight] and embedding["weight_decay"] == 0.0
    assert all(p is not model.tok_embeddings.weight for p in decay["params"])
    set_lr(opt, 1e-3)
    assert (decay["lr"], no_decay["lr"], embedding["lr"]) == (1e-3, 1e-3, 4e-3)

    # a tied embedding is the output projection too: it stays with the decayed matrices
    tied = Llama(tiny_model(tie_embeddings=True))
    decay, no_decay = make_optimizer(tied, cfg).param_groups
    assert any(p is tied.tok_embeddings.weight for p in decay["params"])


def test_init_std_scales_with_width_and_can_be_set(
    tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    from trainer.model.llama import Llama, default_init_std

    # GPT-2's 0.02 at width 768, 1/sqrt(width) elsewhere
    assert default_init_std(768) == pytest.approx(0.02)
    assert default_init_std(192) == pytest.approx(0.04)

    def stds(model: Llama) -> tuple[float, float, float]:
        return (
            model.layers[0].attention.wq.weight.std().item(),
            model.layers[0].attention.wo.weight.std().item(),  # residual projection: / sqrt(2 n_layer)
            model.tok_embeddings.weight.std().item(),
        )

    torch.manual_seed(0)
    wq, wo, emb = stds(Llama(tiny_model(n_embd=192, n_layer=2)))
    assert wq == pytest.approx(0.04, rel=0.05) and emb == pytest.approx(0.04, rel=0.05)
    assert wo == pytest.approx(0.04 / 2, rel=0.05)
    assert Llama(tiny_model(n_embd=192)).layers[0].attention_norm.weight.eq(1).all()

    # the hyperparameter reaches the model a run trains
    from trainer.checkpoint import load_checkpoint

    cfg = tiny_train(max_steps=1, learning_rate=1e-7, init_std=0.1)
    train(tiny_model(n_embd=192, n_layer=2), cfg, shakespeare_data, tmp_path, tokenizer=byte_tokenizer)
    state = load_checkpoint(tmp_path / "final").model_state
    assert state["layers.0.attention.wq.weight"].std().item() == pytest.approx(0.1, rel=0.05)


# ---------------------------------------------------------------- schedules


def test_cosine_schedule_warmup_and_floor():
    cfg = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_steps=10)
    lrs = [lr_at(s, cfg, 100) for s in range(120)]
    assert lrs[0] == pytest.approx(1e-3 / 11)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11], strict=True))  # warmup rises
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[55] == pytest.approx(5.5e-4)  # half way down the cosine
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101], strict=True))
    assert lrs[100] == lrs[119] == pytest.approx(1e-4)


def test_default_min_lr_and_warmup():
    cfg = TrainConfig(learning_rate=2e-3)
    assert cfg.resolved_warmup(1000) == 100 and cfg.resolved_warmup(50) == 5
    assert lr_at(1000, cfg, 1000) == pytest.approx(2e-4)


def test_constant_schedule():
    cfg = TrainConfig(learning_rate=1e-3, schedule="constant", warmup_steps=4)
    assert [lr_at(s, cfg, 100) for s in (0, 3, 4, 99, 500)] == pytest.approx([2e-4, 8e-4, 1e-3, 1e-3, 1e-3])


def test_cosine_restarts_like_llama_cpp():
    cfg = TrainConfig(
        learning_rate=1.0,
        schedule="cosine-restarts",
        warmup_steps=0,
        cos_decay_steps=10,
        cos_decay_restart=2.0,
        cos_decay_alpha=0.1,
    )
    lr = [lr_at(s, cfg, 1000) for s in range(40)]
    assert lr[0] == pytest.approx(1.0)
    assert lr[5] == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr[10] == pytest.approx(0.1)  # end of the first cycle: the floor alpha * lr
    assert lr[11] > 0.9  # restart, second cycle 20 steps long
    assert lr[20] == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr[30] == pytest.approx(0.1)
    assert min(lr) >= 0.1 - 1e-12


@pytest.mark.parametrize("warmup_steps, noted", [(4, True), (9, True), (3, False)])
def test_a_warmup_as_long_as_the_run_is_a_note(
    warmup_steps, noted, tmp_path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
):
    rec = Recorder()
    cfg = tiny_train(max_steps=4, warmup_steps=warmup_steps, learning_rate=1e-3, eval_every=0)
    train(tiny_model(), cfg, shakespeare_data, tmp_path, rec, tokenizer=byte_tokenizer)
    assert rec.started is not None
    notes = [n for n in rec.started["notes"] if n.startswith(f"warmup_steps {warmup_steps} ")]
    assert len(notes) == noted
    if noted:  # the last step's rate: 4 of the warmup's steps + 1
        assert f"ends at {1e-3 * 4 / (warmup_steps + 1):.3g}, short of learning_rate 0.001" in notes[0]


def test_a_bpe_vocabulary_smaller_than_asked_is_a_note(tmp_path, tiny_model, tiny_train):
    """The BPE tokenizer learns what merges the data has: 4096 asked of a small chat file gives about
    600, and the run says so (the model's vocabulary is the tokenizer's)."""
    rec = Recorder()
    data = Path(__file__).parents[1] / "data" / "sample_chat.jsonl"
    cfg = tiny_train(max_steps=1, tokenizer="bpe", vocab_size=4096)
    train(tiny_model(), cfg, data, tmp_path, rec)
    assert rec.started is not None
    (note,) = [n for n in rec.started["notes"] if n.startswith("vocab_size 4,096: ")]
    learned = json.loads((tmp_path / "final" / "config.json").read_text())["model"]["vocab_size"]
    assert learned < 4096 and f"the model's vocabulary is {learned:,}" in note


@pytest.mark.parametrize(
    "settings, validation_file, note",
    [
        (dict(eval_every=0), False, "eval_every 0: nothing evaluates the "),
        (dict(eval_every=0, val_fraction=0.0), False, None),
        (dict(eval_every=0), True, None),  # a validation file's tokens are not the training file's
        (dict(val_fraction=0.3), True, "val_fraction 0.3 does nothing in this run: the validation file"),
        (dict(), True, None),
    ],
)
def test_validation_data_the_run_cannot_use_is_a_note(
    settings, validation_file, note, tmp_path, tiny_model, tiny_train, shakespeare
):
    """Held-out tokens nothing evaluates (and nothing trains on), and a val_fraction a validation
    file overrides, are said at the start."""
    rec = Recorder()
    cfg = tiny_train(max_steps=1, **settings)
    train(
        tiny_model(),
        cfg,
        shakespeare,
        tmp_path,
        rec,
        validation_path=shakespeare if validation_file else None,
    )
    assert rec.started is not None
    said = [n for n in rec.started["notes"] if n.startswith(("eval_every", "val_fraction"))]
    assert len(said) == (note is not None), said
    assert note is None or note in said[0], said
