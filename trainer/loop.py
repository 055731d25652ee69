"""The training loop: `train(model_cfg, train_cfg, data, out_dir, callbacks)`.

Reproducibility rules this file keeps (they make a resumed run bitwise equal to an uninterrupted
one on CPU):
- every batch comes from the data sampler, whose position is checkpointed; a step draws all
  batch_size * grad_accum windows at once and splits them into micro-batches, so the data (and the
  loss curve) does not depend on how the batch is split;
- the learning rate is a pure function of the step (trainer.optim.lr_at);
- evaluation uses a fresh, separately seeded sampler each time, so it sees the same batches every
  time and never touches the training sampler or the global RNGs;
- model weights, optimizer tensors and RNG states are saved exactly (fp32 safetensors + JSON).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from trainer.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_optimizer_state,
    rotate_checkpoints,
    save_checkpoint,
    set_rng_state,
)
from trainer.config import ConfigError, ModelConfig, TrainConfig
from trainer.model import Llama
from trainer.optim import lr_at, make_optimizer, set_lr

StopReason = Literal["completed", "stop", "pause", "time_limit"]
NEWLINE_ID = 10  # byte 10 is id 10 in both the byte and the BPE tokenizer


class Callbacks:
    """Hooks for the service (and the CLI's progress display). All no-ops; override what you need.
    They run on the training thread between steps, so keep them cheap."""

    def on_start(self, info: dict[str, Any]) -> None:
        """info: total_steps, start_step, n_params, tokens_per_step, device, dtype."""

    def on_step(
        self, step: int, train_loss: float, lr: float, grad_norm: float, tokens_per_s: float, tokens_seen: int
    ) -> None:
        """Called every `log_every` steps (and on the last step)."""

    def on_eval(self, step: int, val_loss: float) -> None:
        pass

    def on_checkpoint(self, step: int, path: Path) -> None:
        """A complete `checkpoints/step-XXXXXXXX` folder (periodic, or written on stop/pause/time
        limit). final/ and best/ are reported through TrainResult and the folder layout instead."""

    def should_stop(self) -> Literal["stop", "pause"] | None:
        return None


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""

    code = "training_diverged"

    def __init__(self, step: int, loss: float):
        self.step, self.loss = step, loss
        super().__init__(
            f"training diverged at step {step}: the loss is {loss}. Lower the learning rate, "
            "use more warmup steps or gradient clipping, or train in float32."
        )


@dataclass
class TrainResult:
    step: int
    tokens_seen: int
    stop_reason: StopReason
    final_checkpoint: Path | None  # final/ when completed; the step checkpoint written on stop/pause
    best_val_loss: float | None
    last_train_loss: float | None
    last_val_loss: float | None


def resolve_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError([("device", "cuda was asked for but no CUDA device is available; use auto or cpu")])
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    """auto: bf16 on a CUDA device that supports it, else fp32 (bf16 on CPU only when asked)."""
    if cfg.dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.dtype]


def total_steps_for(cfg: TrainConfig, sampler: Any) -> int:
    """max_steps, else enough whole batches to visit every window n_epochs times (the last batch of
    an epoch runs into the next, as the sampler does), else 1000."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    if cfg.n_epochs is not None:
        return max(1, sampler.steps_for_epochs(cfg.n_epochs))
    return 1000


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    make_sampler: Callable[[], Any],
    n_batches: int,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> float:
    """Mean loss over the first n_batches of a freshly seeded sampler (the same batches every call)."""
    was_training = model.training
    model.eval()
    sampler = make_sampler()
    total = torch.zeros((), device=device, dtype=torch.float64)
    for _ in range(n_batches):
        x, y = sampler.next_batch()
        with autocast():
            _, loss = model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        total += loss.double()
    model.train(was_training)
    return float(total / n_batches)


class _Metrics:
    """metrics.jsonl writer. On resume, drops lines past the resumed step (logged after the last
    checkpoint of the interrupted run) so the file reads as one run."""

    def __init__(self, path: Path, keep_upto: int | None):
        if keep_upto is not None and path.exists():
            kept = []
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= keep_upto:
                        kept.append(line)
                except ValueError:
                    continue  # a torn last line from a crash
            path.write_text("".join(k + "\n" for k in kept))
        elif keep_upto is None:
            path.write_text("")
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    train_path: Any,
    out_dir: Path,
    callbacks: Callbacks | None = None,
    *,
    tokenizer: Any = None,
    validation_path: Any = None,
    resume: bool | Path = False,
    init_from: Path | None = None,
) -> TrainResult:
    """Train a Llama; see docs/INTERFACES.md for the contract.

    train_path is a text/JSONL file or a prepared `trainer.data.TokenData` (then `tokenizer` is
    required). Resuming takes the model config and tokenizer from the checkpoint and the training
    config from `train_cfg` (so max_steps can be raised). `resume=True` with no checkpoint in
    out_dir starts a fresh run; a fresh run refuses an out_dir that already holds checkpoints.
    """
    from trainer.data import BatchSampler, TokenData, prepare_data  # lazy: keeps `import trainer.loop` light

    cfg = train_cfg
    callbacks = callbacks or Callbacks()
    if cfg.optimizer == "lbfgs" and cfg.dtype == "float16":
        raise ConfigError(
            [("dtype", "float16 needs a gradient scaler, which L-BFGS cannot use; use bfloat16 or float32")]
        )
    device = resolve_device(cfg)
    dtype = resolve_dtype(cfg, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out_dir / "checkpoints"

    # ---- what we start from
    resume_path: Path | None = None
    if resume is True:
        resume_path = latest_checkpoint(out_dir)
    elif resume:
        resume_path = Path(resume)
    if resume_path is None and latest_checkpoint(out_dir) is not None:
        raise FileExistsError(
            f"{out_dir} already holds checkpoints of a run; resume it (--resume) "
            "or choose another output folder"
        )
    resumed = load_checkpoint(resume_path) if resume_path is not None else None
    init = load_checkpoint(init_from) if init_from is not None and resumed is None else None
    source = resumed or init
    if source is not None:
        tokenizer, model_cfg = source.tokenizer, source.model_config

    # ---- data (errors here come before any training)
    if isinstance(train_path, TokenData):
        if tokenizer is None:
            raise ValueError("train() with prepared TokenData needs the tokenizer that produced it")
        data = train_path
    else:
        if tokenizer is None:
            from trainer.dataformat import iter_documents
            from trainer.tokenizers import train_tokenizer

            tokenizer = train_tokenizer(
                cfg.tokenizer, cfg.resolved_vocab_size, iter_documents(Path(train_path))
            )
        data = prepare_data(
            Path(train_path),
            tokenizer,
            validation_path=validation_path,
            val_fraction=cfg.val_fraction,
            cache_dir=out_dir / "cache",
        )
    if model_cfg.vocab_size != tokenizer.vocab_size:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    B, K, ctx = cfg.batch_size, cfg.grad_accum, model_cfg.ctx
    sampler = BatchSampler(
        data.train,
        ctx,
        B * K,
        seed=cfg.seed,
        samples_after_nl=cfg.samples_after_nl,
        newline_id=NEWLINE_ID,
        epochs=cfg.n_epochs,
    )
    make_val_sampler = None
    if data.val is not None and len(data.val) > 0 and cfg.eval_every > 0:

        def make_val_sampler() -> Any:
            return BatchSampler(data.val, ctx, B, seed=cfg.seed + 1, name="validation data")

        make_val_sampler()  # too short for one window -> DataError now, not at the first evaluation
    total_steps = total_steps_for(cfg, sampler)

    # ---- model, optimizer, precision
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)
    model = Llama(model_cfg)
    if source is not None:
        model.load_state_dict(source.model_state, strict=True)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
    model.to(device)
    model.activation_checkpointing = cfg.activation_checkpointing
    optimizer = make_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    start_step, tokens_seen, best_val = 0, 0, math.inf
    if resumed is not None:
        st = resumed.state
        start_step, tokens_seen = int(st["step"]), int(st["tokens_seen"])
        best_val = st.get("best_val_loss") if st.get("best_val_loss") is not None else math.inf
        if st.get("optimizer_meta"):
            load_optimizer_state(optimizer, model, resumed.path, st["optimizer_meta"])
            scaler_state = st["optimizer_meta"].get("extra", {}).get("scaler")
            if scaler_state and scaler.is_enabled():
                scaler.load_state_dict(scaler_state)
        if st.get("sampler") is not None:
            sampler.load_state_dict(st["sampler"])
        set_rng_state(st["rng"])
    fwd = torch.compile(model) if cfg.compile else model

    def autocast() -> contextlib.AbstractContextManager:
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=dtype)

    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf  # inf: measure the norm, scale by 1.0

    def forward_backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Accumulate gradients of the batch mean loss over K micro-batches; returns that loss."""
        loss_sum = torch.zeros((), device=device)
        for xm, ym in zip(x.chunk(K), y.chunk(K), strict=True):
            with autocast():
                _, loss = fwd(xm, ym)
            loss = loss / K
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        return loss_sum

    def adamw_step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = forward_backward(x, y)
        scaler.unscale_(optimizer)  # no-op when the scaler is disabled
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm

    def lbfgs_step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        norms: list[torch.Tensor] = []

        def closure() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=False)
            loss = forward_backward(x, y)
            if not norms:
                norms.append(torch.nn.utils.clip_grad_norm_(params, math.inf))
            return loss

        loss = optimizer.step(closure)
        optimizer.zero_grad(set_to_none=True)
        return torch.as_tensor(loss), norms[0]

    do_step = lbfgs_step if cfg.optimizer == "lbfgs" else adamw_step
    tokens_per_step = B * K * ctx

    def checkpoint_state(step: int) -> dict[str, Any]:
        return {
            "step": step,
            "tokens_seen": tokens_seen,
            "best_val_loss": None if math.isinf(best_val) else best_val,
            "sampler": sampler.state_dict(),
            "total_steps": total_steps,
        }

    def save(path: Path, step: int) -> Path:
        extra = {"scaler": scaler.state_dict()} if scaler.is_enabled() else {}
        return save_checkpoint(
            path,
            model=model,
            model_config=model_cfg,
            train_config=cfg,
            tokenizer=tokenizer,
            state=checkpoint_state(step),
            optimizer=optimizer,
            extra_meta=extra,
        )

    def save_step_checkpoint(step: int) -> Path:
        path = save(ckpt_dir / f"step-{step:08d}", step)
        rotate_checkpoints(ckpt_dir, cfg.keep_checkpoints)
        callbacks.on_checkpoint(step, path)
        return path

    # ---- the loop
    metrics = _Metrics(out_dir / "metrics.jsonl", start_step if resumed is not None else None)
    callbacks.on_start(
        {
            "total_steps": total_steps,
            "start_step": start_step,
            "n_params": model.num_params(),
            "tokens_per_step": tokens_per_step,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
        }
    )
    step = start_step
    stop_reason: StopReason = "completed"
    last_train: float | None = None
    last_val: float | None = None
    last_ckpt_step = start_step if resumed is not None else None
    t0 = time.perf_counter()
    log_t, log_tokens, excluded = t0, tokens_seen, 0.0  # excluded: eval/checkpoint time, not training
    model.train()
    try:
        while step < total_steps:
            request = callbacks.should_stop()
            if request in ("stop", "pause"):
                stop_reason = request
                break
            if cfg.time_limit is not None and time.perf_counter() - t0 >= cfg.time_limit:
                stop_reason = "time_limit"
                break
            lr = lr_at(step, cfg, total_steps)
            set_lr(optimizer, lr)
            x, y = sampler.next_batch()
            loss_t, norm_t = do_step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
            step += 1
            tokens_seen += tokens_per_step

            if step % cfg.log_every == 0 or step == total_steps:
                last_train = loss_t.item()  # the one device sync per logged step
                if not math.isfinite(last_train):
                    raise TrainingDiverged(step, last_train)
                grad_norm = float(norm_t)
                now = time.perf_counter()
                tps = (tokens_seen - log_tokens) / max(now - log_t - excluded, 1e-9)
                log_t, log_tokens, excluded = now, tokens_seen, 0.0
                metrics.write(
                    {
                        "step": step,
                        "train_loss": last_train,
                        "lr": lr,
                        "grad_norm": grad_norm,
                        "tokens_per_s": tps,
                        "tokens_seen": tokens_seen,
                        "time": time.time(),
                    }
                )
                callbacks.on_step(step, last_train, lr, grad_norm, tps, tokens_seen)

            t_extra = time.perf_counter()
            if make_val_sampler is not None and (step % cfg.eval_every == 0 or step == total_steps):
                last_val = evaluate(fwd, make_val_sampler, cfg.eval_batches, device, autocast)
                metrics.write(
                    {
                        "step": step,
                        "val_loss": last_val,
                        "val_ppl": math.exp(min(last_val, 700.0)),
                        "time": time.time(),
                    }
                )
                callbacks.on_eval(step, last_val)
                if last_val < best_val:
                    best_val = last_val
                    save(out_dir / "best", step)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total_steps:
                save_step_checkpoint(step)
                last_ckpt_step = step
            excluded += time.perf_counter() - t_extra

        if stop_reason == "completed":
            final: Path | None = save(out_dir / "final", step)
        elif last_ckpt_step == step and (ckpt_dir / f"step-{step:08d}" / "state.json").exists():
            final = ckpt_dir / f"step-{step:08d}"
        elif last_ckpt_step == step and resume_path is not None:
            final = resume_path  # stopped before taking a step after resuming
        else:
            final = save_step_checkpoint(step)
    finally:
        metrics.close()
    return TrainResult(
        step=step,
        tokens_seen=tokens_seen,
        stop_reason=stop_reason,
        final_checkpoint=final,
        best_val_loss=None if math.isinf(best_val) else best_val,
        last_train_loss=last_train,
        last_val_loss=last_val,
    )
