"""Loss masking for instruction data and token accuracy: the loss of prompt/completion and chat JSONL
covers completions / assistant turns only (train_on_inputs: everything), masked targets get exactly
zero gradient, micro-batches weigh by their target count, plain text is untouched, and accuracy is
reported beside the loss, down to the final full validation pass."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.trainer.conftest import read_metrics, train_losses
from tests.trainer.test_resume import StopAfter, assert_bitwise_equal
from trainer.config import TrainConfig
from trainer.config.metrics import EvalMetrics, FullEvalMetrics, StepMetrics
from trainer.data.batches import epoch_starts, full_pass, gather
from trainer.data.formats import DataError
from trainer.data.prepare import BatchSampler, TokenData, prepare_data
from trainer.data.tokenizers import EOS_ID, ByteTokenizer, train_tokenizer
from trainer.model.llama import IGNORE_INDEX
from trainer.run.loop import train
from trainer.run.report import Callbacks
from trainer.run.setup import start_run, train_sampler
from trainer.run.step import OptimizerStep, count_targets, evaluate_batches

DATA = Path(__file__).resolve().parents[1] / "data"
WORDS = "the a water moon bees light sun earth orbit boils dance flowers days minutes science".split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize() + "."


def chat_records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Varied conversations: system prompts, several turns, weight-0 turns, text parts, a final user turn."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        messages: list[dict[str, Any]] = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": "You are terse."})
        for turn in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": sentence(rng)})
            reply: dict[str, Any] = {"role": "assistant", "content": sentence(rng)}
            if i % 5 == 1 and turn == 0:
                reply["weight"] = 0
            if i % 7 == 2:
                reply["content"] = [
                    {"type": "text", "text": reply["content"]},
                    {"type": "text", "text": " Ok."},
                ]
            messages.append(reply)
        if i % 11 == 4:
            messages.append({"role": "user", "content": "Thanks."})
        records.append({"messages": messages})
    return records


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def content_text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def trained_texts(records: list[dict[str, Any]]) -> tuple[list[str], int]:
    """What the loss should cover, from the records alone: each weighted assistant reply with its
    newline, and the number of records whose EOS is trained (ending with such a reply)."""
    texts, eos = [], 0
    for r in records:
        msgs = r["messages"]
        for m in msgs:
            if m["role"] == "assistant" and m.get("weight", 1) == 1:
                texts.append(content_text(m["content"]) + "\n")
        last = msgs[-1]
        eos += last["role"] == "assistant" and last.get("weight", 1) == 1
    return texts, eos


def dense_mask(spans: np.ndarray, n: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    for start, end in spans:
        mask[start:end] = True
    return mask


@pytest.fixture(scope="module")
def chat_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", chat_records(400))


# --- what the loss covers ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_chat_loss_covers_assistant_replies_and_their_end_only(chat_path: Path, kind: str) -> None:
    records = [json.loads(line) for line in chat_path.read_text().splitlines()]
    tok = ByteTokenizer() if kind == "byte" else train_tokenizer("bpe", 400, [chat_path.read_text()])
    data = prepare_data(chat_path, tok, val_fraction=0.0)
    assert data.train_spans is not None
    tokens = np.asarray(data.train)
    mask = dense_mask(data.train_spans, len(tokens))
    texts, n_eos = trained_texts(records)
    covered = tokens[mask]
    assert int((covered == EOS_ID).sum()) == n_eos  # the EOS after a trained last reply, no other
    assert int((tokens == EOS_ID).sum()) == len(records)
    # the covered tokens, EOS aside, are exactly the replies and their newlines
    assert tok.decode(covered[covered != EOS_ID].tolist()) == "".join(texts)
    if kind == "byte":
        assert int(mask.sum()) == sum(len(t.encode()) for t in texts) + n_eos


def test_prompt_completion_covers_completions(tmp_path: Path) -> None:
    path = DATA / "sample_prompt_completion.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    data = prepare_data(path, ByteTokenizer(), val_fraction=0.0)
    assert data.train_spans is not None
    tokens = np.asarray(data.train)
    covered = tokens[dense_mask(data.train_spans, len(tokens))]
    assert (
        bytes(covered[covered != EOS_ID].astype(np.uint8))
        == "".join(r["completion"] for r in records).encode()
    )
    assert int((covered == EOS_ID).sum()) == len(records)


def test_text_records_and_plain_text_have_no_spans(tmp_path: Path) -> None:
    assert prepare_data(DATA / "sample_text.jsonl", ByteTokenizer()).train_spans is None
    data = prepare_data(DATA / "tiny_shakespeare_100k.txt", ByteTokenizer(), cache_dir=tmp_path)
    assert data.train_spans is None and data.val_spans is None
    assert not list(tmp_path.glob("*.spans"))


def test_spans_survive_the_cache_and_the_validation_split(chat_path: Path, tmp_path: Path) -> None:
    tok = ByteTokenizer()
    whole = prepare_data(chat_path, tok, val_fraction=0.0)
    split = prepare_data(chat_path, tok, val_fraction=0.2, cache_dir=tmp_path)
    again = prepare_data(chat_path, tok, val_fraction=0.2, cache_dir=tmp_path)  # from the cache
    assert len(list(tmp_path.glob("*.spans"))) == 1
    assert whole.train_spans is not None and split.val is not None
    mask = dense_mask(whole.train_spans, len(whole.train))
    cut = len(split.train)
    for d in (split, again):
        assert d.train_spans is not None and d.val_spans is not None
        assert np.array_equal(dense_mask(d.train_spans, cut), mask[:cut])
        assert np.array_equal(dense_mask(d.val_spans, len(whole.train) - cut), mask[cut:])


@pytest.mark.parametrize("mode", [{}, {"epochs": 2}, {"samples_after_nl": True}])
def test_batches_mask_exactly_the_uncovered_targets(chat_path: Path, mode: dict[str, Any]) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)
    assert data.train_spans is not None
    mask = dense_mask(data.train_spans, len(data.train))
    ctx = 48
    sampler = BatchSampler(data.train, ctx, 16, seed=5, spans=data.train_spans, **mode)
    plain = np.asarray(data.train, dtype=np.int64)
    seen = 0
    for _ in range(20):
        starts = sampler._next_starts()  # the same draw next_batch makes, to know where windows start
        x, y = gather(sampler.tokens, starts, ctx, sampler.spans)
        positions = starts[:, None] + np.arange(1, ctx + 1)
        expected = np.where(mask[positions], plain[positions], IGNORE_INDEX)
        assert np.array_equal(y.numpy(), expected)
        assert np.array_equal(x.numpy(), plain[starts[:, None] + np.arange(ctx)])
        assert ((y != IGNORE_INDEX).sum(dim=1) > 0).all()  # no window without a target
        seen += int((y == IGNORE_INDEX).sum())
    assert seen > 0  # prompts were masked


@pytest.mark.parametrize("batch_size", [1, 3])
def test_masking_targets_never_touches_the_inputs(chat_path: Path, batch_size: int) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)
    sampler = BatchSampler(data.train, 40, batch_size, seed=2, spans=data.train_spans)
    for _ in range(30):
        x, y = sampler.next_batch()
        assert int(x.min()) >= 0 and int(x.max()) < 258
    for x, _ in full_pass(data.train, 40, batch_size, data.train_spans, max_windows=7):
        assert int(x.min()) >= 0  # the last batch holds one window


def test_epochs_visit_every_window_with_a_target_once(chat_path: Path) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)
    ctx = 64
    valid = epoch_starts(len(data.train), ctx, data.train_spans)
    everything = epoch_starts(len(data.train), ctx, None)
    assert 0 < len(valid) < len(everything) or len(valid) == len(everything)
    sampler = BatchSampler(data.train, ctx, 7, seed=1, epochs=1, spans=data.train_spans)
    assert sampler.windows_per_epoch == len(valid)
    drawn = np.concatenate([sampler._next_starts() for _ in range(sampler.total_steps or 0)])
    assert sorted(set(drawn[: len(valid)].tolist())) == valid.tolist()


def test_full_pass_reads_every_window_once(chat_path: Path) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)
    spans, ctx = data.train_spans, 32
    assert spans is not None
    batches = list(full_pass(data.train, ctx, 10, spans))
    starts = epoch_starts(len(data.train), ctx, spans)
    assert sum(len(x) for x, _ in batches) == len(starts) and len(batches[-1][0]) <= 10
    ys = torch.cat([y for _, y in batches])
    mask = dense_mask(spans, len(data.train))
    assert count_targets(ys) == int(mask[starts[:, None] + np.arange(1, ctx + 1)].sum())
    few = list(full_pass(data.train, ctx, 10, spans, max_windows=25))
    assert sum(len(x) for x, _ in few) == 25


def test_no_trained_token_is_a_clear_error_unless_train_on_inputs(
    tmp_path: Path, tiny_model, tiny_train
) -> None:
    records = [
        {
            "messages": [
                {"role": "user", "content": sentence(random.Random(i))},
                {"role": "assistant", "content": "no", "weight": 0},
            ]
        }
        for i in range(60)
    ]
    path = write_jsonl(tmp_path / "zero.jsonl", records)
    with pytest.raises(DataError, match="no window with a token the loss covers.*train_on_inputs"):
        train(tiny_model(), tiny_train(max_steps=1), path, tmp_path / "a", tokenizer=ByteTokenizer())
    result = train(
        tiny_model(),
        tiny_train(max_steps=2, train_on_inputs=True),
        path,
        tmp_path / "b",
        tokenizer=ByteTokenizer(),
    )
    assert result.step == 2 and math.isfinite(result.last_train_loss or math.nan)


def test_train_on_inputs_trains_on_every_token(chat_path: Path) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)
    masked = train_sampler(TrainConfig(batch_size=8, seed=3), 64, data)
    everything = train_sampler(TrainConfig(batch_size=8, seed=3, train_on_inputs=True), 64, data)
    assert masked.spans is not None and everything.spans is None
    assert (masked.next_batch()[1] == IGNORE_INDEX).any()
    x, y = everything.next_batch()
    assert not (y == IGNORE_INDEX).any()
    # the same windows as plain text sampling of these tokens
    x2, y2 = BatchSampler(data.train, 64, 8, seed=3).next_batch()
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_plain_text_batches_are_those_of_before_masking() -> None:
    """A digest of tokens and the first batches in every sampling mode, computed with the trainer as
    it was before loss masking existed (commit 17bc375): plain text is untouched."""
    expected = {
        "tiny_shakespeare_100k.txt": "f93c92e31fa903130227c6a0f15fe3180be0cad918d60d564d1ea627d7f105ed",
        "sample_text.jsonl": "b571538a52d70d73a1f940533c301e8cd27f7af6bb49172530b41c628683fa23",
    }
    for name, digest in expected.items():
        td = prepare_data(DATA / name, ByteTokenizer(), val_fraction=0.1)
        assert td.train_spans is None and td.val_spans is None
        h = hashlib.sha256(np.asarray(td.train).tobytes() + np.asarray(td.val).tobytes())
        for kw in [{}, {"epochs": 2}, {"samples_after_nl": True}]:
            s = BatchSampler(td.train, 32, 8, seed=3, **kw)
            for _ in range(5):
                x, y = s.next_batch()
                h.update(x.numpy().tobytes())
                h.update(y.numpy().tobytes())
        assert h.hexdigest() == digest, name


# --- gradients ------------------------------------------------------------------------------------


def _run(tmp_path: Path, tiny_model, tiny_train, chat_path: Path, **cfg: Any) -> Any:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)
    return start_run(
        tiny_model(),
        tiny_train(**cfg),
        data,
        tmp_path,
        tokenizer=ByteTokenizer(),
        validation_path=None,
        resume=False,
        init_from=None,
    )


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_masked_targets_get_exactly_zero_gradient(
    tmp_path: Path, tiny_model, tiny_train, chat_path: Path
) -> None:
    run = _run(tmp_path, tiny_model, tiny_train, chat_path, batch_size=2, grad_accum=2)
    x, y = run.sampler.next_batch()  # 4 windows: two micro-batches of 2
    y[2:] = IGNORE_INDEX  # the second micro-batch has no target at all
    covered = y != IGNORE_INDEX
    assert covered[:2].any() and not covered.all()
    logits_seen: list[torch.Tensor] = []

    def keep_grad(_module: Any, _inputs: Any, out: torch.Tensor) -> None:  # fp32: these are the logits
        out.retain_grad()
        logits_seen.append(out)

    hook = run.model.output.register_forward_hook(keep_grad)
    step = OptimizerStep(run)
    loss, accuracy = step._forward_backward(x, y, count_targets(y))
    hook.remove()
    grads = _grads(run.model)
    logit_grads = torch.cat([t.grad for t in logits_seen])  # (4, ctx, vocab) in micro-batch order
    assert torch.equal(logit_grads[~covered], torch.zeros_like(logit_grads[~covered]))  # exactly zero
    assert (logit_grads[covered].abs().sum(dim=-1) > 0).all()
    assert math.isfinite(float(loss))

    # the same gradients as a loss written out over the covered targets only
    run.optimizer.zero_grad(set_to_none=True)
    logits, _ = run.model(x)
    per_token = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), y.clamp(min=0).reshape(-1), reduction="none"
    )
    reference = (per_token * covered.reshape(-1)).sum() / covered.sum()
    reference.backward()
    assert float(loss) == pytest.approx(float(reference.detach()), rel=1e-6)
    for name, g in _grads(run.model).items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7, msg=name)
    predicted = logits.argmax(-1)
    assert float(accuracy) == pytest.approx(float((predicted == y)[covered].float().mean()))

    # the same windows unmasked (what train_on_inputs does) train the masked positions too
    run.optimizer.zero_grad(set_to_none=True)
    full_y = torch.cat([x[:, 1:], y[:, -1:].clamp(min=0)], dim=1)  # every position a target
    logits_seen.clear()
    hook = run.model.output.register_forward_hook(keep_grad)
    step._forward_backward(x, full_y, count_targets(full_y))
    hook.remove()
    unmasked = torch.cat([t.grad for t in logits_seen])
    assert (unmasked[~covered].abs().sum(dim=-1) > 0).all()


def test_a_step_without_targets_changes_nothing_and_is_not_nan(
    tmp_path: Path, tiny_model, tiny_train, chat_path
) -> None:
    run = _run(tmp_path, tiny_model, tiny_train, chat_path, batch_size=2)
    x, y = run.sampler.next_batch()
    loss, accuracy = OptimizerStep(run)._forward_backward(x, torch.full_like(y, IGNORE_INDEX), 0)
    assert float(loss) == 0.0 and float(accuracy) == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in _grads(run.model).values())
    assert (
        evaluate_batches(run.model, [(x, torch.full_like(y, IGNORE_INDEX))], run.device, run.autocast) is None
    )


@pytest.mark.parametrize("batch_size,grad_accum", [(4, 2), (2, 4)])
def test_grad_accum_weighs_micro_batches_by_their_targets(
    tmp_path: Path, tiny_model, tiny_train, chat_path: Path, batch_size: int, grad_accum: int
) -> None:
    """Masked micro-batches hold different target counts, yet splitting the batch changes nothing:
    the step's loss is the mean over all its covered targets."""
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)

    def losses(out: Path, b: int, k: int) -> list[float]:
        train(
            tiny_model(),
            tiny_train(max_steps=6, batch_size=b, grad_accum=k),
            data,
            out,
            tokenizer=ByteTokenizer(),
        )
        return train_losses(out)

    reference = losses(tmp_path / "one", batch_size * grad_accum, 1)
    np.testing.assert_allclose(losses(tmp_path / "split", batch_size, grad_accum), reference, rtol=1e-4)


# --- accuracy and the full validation pass through train() --------------------------------------


class Recorder(Callbacks):
    def __init__(self) -> None:
        self.steps: list[tuple[int, float, float | None]] = []
        self.evals: list[tuple[int, float, float | None]] = []
        self.full: list[tuple[int, float, float]] = []

    def on_step(self, metrics: StepMetrics) -> None:
        self.steps.append((metrics.step, metrics.train_loss, metrics.train_accuracy))

    def on_eval(self, metrics: EvalMetrics) -> None:
        self.evals.append((metrics.step, metrics.val_loss, metrics.val_accuracy))

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        self.full.append((metrics.step, metrics.full_valid_loss, metrics.full_valid_mean_token_accuracy))


def test_chat_run_reports_accuracy_and_a_full_validation_pass(
    tmp_path: Path, tiny_model, tiny_train, chat_path: Path
) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.15)
    rec = Recorder()
    cfg = tiny_train(max_steps=40, eval_every=20, learning_rate=1e-2)
    result = train(tiny_model(), cfg, data, tmp_path, rec, tokenizer=ByteTokenizer())
    accuracies = [a for _, _, a in rec.steps]
    assert all(a is not None and 0.0 <= a <= 1.0 for a in accuracies)
    assert np.mean(accuracies[-5:]) > np.mean(accuracies[:5])  # it learns
    assert [s for s, _, _ in rec.evals] == [20, 40] and all(0 <= a <= 1 for _, _, a in rec.evals)
    assert len(rec.full) == 1 and rec.full[0][0] == 40
    _, full_loss, full_acc = rec.full[0]
    assert (result.full_valid_loss, result.full_valid_accuracy) == (full_loss, full_acc)
    assert (result.last_train_accuracy, result.last_val_accuracy) == (accuracies[-1], rec.evals[-1][2])

    # the full pass is the mean over every validation window's covered targets, recomputed here
    from trainer.checkpoint import load_model

    model, _ = load_model(tmp_path / "final")
    assert data.val is not None
    again = evaluate_batches(
        model, full_pass(data.val, 32, 4, data.val_spans), torch.device("cpu"), torch.no_grad
    )
    assert again == pytest.approx((full_loss, full_acc), rel=1e-5)

    lines = read_metrics(tmp_path)
    assert [m["train_accuracy"] for m in lines if "train_loss" in m] == accuracies
    assert [m["val_accuracy"] for m in lines if "val_loss" in m] == [a for _, _, a in rec.evals]
    assert lines[-1] == {
        "step": 40,
        "full_valid_loss": full_loss,
        "full_valid_mean_token_accuracy": full_acc,
        "time": lines[-1]["time"],
    }


def test_no_full_pass_without_validation_data_or_when_stopped(
    tmp_path: Path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
) -> None:
    no_val = TokenData(shakespeare_data.train, None)
    rec = Recorder()
    result = train(
        tiny_model(),
        tiny_train(max_steps=2, eval_every=1),
        no_val,
        tmp_path / "a",
        rec,
        tokenizer=byte_tokenizer,
    )
    assert rec.full == [] and result.full_valid_loss is None
    rec = Recorder()
    result = train(
        tiny_model(),
        tiny_train(max_steps=8, eval_every=2),
        shakespeare_data,
        tmp_path / "b",
        StopAfter(2),
        tokenizer=byte_tokenizer,
    )
    assert result.stop_reason == "pause" and result.full_valid_loss is None


@pytest.mark.parametrize("epochs", [None, 2])
def test_masked_pause_and_resume_is_bitwise_identical(
    tmp_path: Path, tiny_model, tiny_train, chat_path: Path, epochs: int | None
) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.1)
    cfg = tiny_train(max_steps=8, n_epochs=epochs, grad_accum=2, eval_every=3)  # epochs: that sampler mode
    straight = train(tiny_model(), cfg, data, tmp_path / "straight", tokenizer=ByteTokenizer())
    first = train(tiny_model(), cfg, data, tmp_path / "resumed", StopAfter(4), tokenizer=ByteTokenizer())
    assert first.stop_reason == "pause"
    second = train(tiny_model(), cfg, data, tmp_path / "resumed", tokenizer=ByteTokenizer(), resume=True)
    assert second.step == straight.step
    assert_bitwise_equal(tmp_path / "straight" / "final", tmp_path / "resumed" / "final")
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")
    assert second.full_valid_loss == straight.full_valid_loss
    assert second.last_train_accuracy == straight.last_train_accuracy


def test_resuming_with_another_train_on_inputs_is_refused(
    tmp_path: Path, tiny_model, tiny_train, chat_path: Path
) -> None:
    data = prepare_data(chat_path, ByteTokenizer(), val_fraction=0.0)
    cfg = tiny_train(max_steps=6)
    train(tiny_model(), cfg, data, tmp_path, StopAfter(2), tokenizer=ByteTokenizer())
    other = cfg.model_copy(update={"train_on_inputs": True})
    with pytest.raises(ValueError, match="masked: saved True, now False"):
        train(tiny_model(), other, data, tmp_path, tokenizer=ByteTokenizer(), resume=True)


class Order(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def on_full_eval(self, metrics: FullEvalMetrics) -> None:
        super().on_full_eval(metrics)
        self.calls.append("full_eval")

    def on_checkpoint(self, step, path) -> None:
        self.calls.append("checkpoint")


def test_time_limit_runs_the_full_pass_before_its_checkpoint(
    tmp_path: Path, tiny_model, tiny_train, shakespeare_data, byte_tokenizer
) -> None:
    """A run stopped by its time limit ends as a model too (the service marks it succeeded): its full
    validation pass is reported before the checkpoint the service stores as final."""
    rec = Order()
    cfg = tiny_train(max_steps=100_000, eval_every=1000, time_limit=0.5)
    result = train(tiny_model(), cfg, shakespeare_data, tmp_path, rec, tokenizer=byte_tokenizer)
    assert result.stop_reason == "time_limit"
    assert rec.calls == ["full_eval", "checkpoint"]
    assert result.full_valid_loss == rec.full[0][1] and rec.full[0][0] == result.step
