"""`TrainRun`: one training run's parts and progress, and how it writes its checkpoints.

`trainer.run.setup.start_run` builds it; `trainer.run.loop.train` advances it step by step. The
progress fields (step, tokens_seen, and the best evaluation: its loss, its step and the evaluations
since) are what a checkpoint's state.json records, so a resumed run continues exactly where the
checkpoint was taken, early stopping included.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from trainer.checkpoint import rotate_checkpoints
from trainer.checkpoint_snapshot import (
    CheckpointSnapshot,
    HostBuffers,
    buffer_plan,
    take_snapshot,
    write_snapshot,
)
from trainer.config import ModelConfig, TrainConfig
from trainer.config.estimate import tokens_per_step
from trainer.model import cpu_kernels
from trainer.model.llama import Llama
from trainer.optim.optimizers import lr_at
from trainer.run.checkpoint_writer import CheckpointWriter
from trainer.run.cpu_threads import ThreadTuner
from trainer.run.cuda_graphs import capture_when_due
from trainer.run.measured_compile import MeasuredCompile

DEFAULT_VAL_FRACTION = float(TrainConfig.model_fields["val_fraction"].default)

if TYPE_CHECKING:
    from trainer.data.batches import Batch
    from trainer.data.prepare import BatchSampler
    from trainer.data.tokenizers import Tokenizer


class StartInfo(TypedDict):
    """What Callbacks.on_start receives."""

    total_steps: int
    start_step: int
    n_params: int
    tokens_per_step: int
    device: str  # e.g. "cpu", "cuda:0" (rank 0's)
    dtype: str  # e.g. "float32", "bfloat16"
    processes: int  # data-parallel processes (devices), 1 without a process group
    dtype_reason: str  # why this dtype (trainer.run.precision: "asked for", or what auto found)
    compile: bool
    compile_reason: str
    kernels: str  # what the element-wise ops run on (trainer.model.cpu_kernels.for_run)
    auto: list[str]  # what each data-aware `auto` setting became, and why (trainer.config.data_aware)
    notes: list[str]  # settings that do nothing in this run, and why (shown, never an error)
    train_tokens: int  # the training data's tokens (what the job page shows beside its files)
    val_tokens: int  # the validation data's (0: none)


@dataclass
class TrainRun:
    cfg: TrainConfig
    model_cfg: ModelConfig
    tokenizer: Tokenizer
    out_dir: Path
    device: torch.device
    dtype: torch.dtype
    model: Llama
    fwd: torch.nn.Module  # what the steps call: the model, or its torch.compile wrapper
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    sampler: BatchSampler
    make_val_sampler: Callable[[], BatchSampler] | None  # None: no evaluation
    make_full_pass: Callable[[], Iterator[Batch]] | None  # the final full validation pass (None: none)
    total_steps: int
    resume_path: Path | None  # the checkpoint this run resumed from (None: a fresh start)
    # data parallelism (trainer.run.collectives): this process's rank, the number of processes, and the
    # DistributedDataParallel wrapper that fwd calls (None: one process, no process group)
    rank: int = 0
    world: int = 1
    ddp: torch.nn.parallel.DistributedDataParallel | None = None
    sharded: bool = False  # sharding fsdp (trainer.run.fsdp): every rank joins evaluation and saving
    # what dtype auto / compile auto decided and why (trainer.run.precision); saved in checkpoints
    precision: dict[str, str | bool] = field(default_factory=dict)
    # what the data-aware `auto` settings became and why, "field value: reason" (trainer.config.data_aware)
    auto: list[str] = field(default_factory=list)
    data_tokens: tuple[int, int] = (0, 0)  # the training data's tokens, the validation data's (StartInfo)
    held_out: bool = False  # the validation data is the training file's last val_fraction
    fresh_optimizer: bool = False  # resumed from a checkpoint without the optimizer's state (a download)
    # progress, saved in every checkpoint
    step: int = 0
    tokens_seen: int = 0
    best_val: float = math.inf
    best_step: int | None = None  # the step of best_val (best/), None before the first evaluation
    evals_since_best: int = 0  # evaluations after best_step without a new best (early stopping)
    # progress, reported in the TrainResult
    last_train_loss: float | None = None
    last_val_loss: float | None = None
    last_train_accuracy: float | None = None
    last_val_accuracy: float | None = None
    full_valid: tuple[float, float] | None = None  # (loss, accuracy) of the final full validation pass
    last_checkpoint_step: int | None = None  # the step of the newest step checkpoint on disk
    writer: CheckpointWriter = field(default_factory=CheckpointWriter)  # background checkpoint writes
    buffers_planned: bool = False  # the writer's host buffers were reserved (between_steps)
    compile_auto: MeasuredCompile | None = None  # compile auto, until it has decided (between_steps)
    thread_tuner: ThreadTuner | None = None  # a CPU run's thread count, from measurement (between_steps)
    graphs_decided: bool = False  # cuda_graphs: the blocks captured, or why not said (between_steps)
    # each block's compiled forward, once compile auto compiled them (its trial switches them on and off)
    compiled_blocks: list[Callable[..., Any] | None] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over all processes (cfg.devices = world: setup checks it)."""
        return tokens_per_step(self.cfg, self.model_cfg.ctx)

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs, evaluates, writes checkpoints and calls the callbacks."""
        return self.rank == 0

    def local_batch(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous slice of the step's global batch (all of it in one process): the
        micro-batches a single process would accumulate as numbers rank*grad_accum .. +grad_accum-1."""
        if self.world == 1:
            return x, y
        n = len(x) // self.world
        part = slice(self.rank * n, (self.rank + 1) * n)
        return x[part], y[part]

    @property
    def best_val_loss(self) -> float | None:
        return None if math.isinf(self.best_val) else self.best_val

    def record_evaluation(self, val_loss: float) -> bool:
        """Count an evaluation; True when it is a new best: lower than the best so far by more than
        early_stopping_min_delta (the first finite one always is: inf - delta is inf)."""
        if val_loss < self.best_val - self.cfg.early_stopping_min_delta:
            self.best_val, self.best_step, self.evals_since_best = val_loss, self.step, 0
            return True
        self.evals_since_best += 1
        return False

    def patience_exhausted(self) -> bool:
        """Early stopping is on and the last `patience` evaluations brought no new best."""
        patience = self.cfg.resolved_early_stopping_patience
        return patience > 0 and self.evals_since_best >= patience

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    def step_checkpoint_path(self) -> Path:
        return self.checkpoint_dir / f"step-{self.step:08d}"

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The mixed-precision context of forward passes (none in float32)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def start_info(self) -> StartInfo:
        """What Callbacks.on_start receives."""
        return {
            "total_steps": self.total_steps,
            "start_step": self.step,
            "n_params": self.model.num_params(),
            "tokens_per_step": self.tokens_per_step,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "processes": self.world,
            "dtype_reason": str(self.precision.get("dtype_reason", "")),
            "compile": bool(self.precision.get("compile", False)),
            "compile_reason": str(self.precision.get("compile_reason", "")),
            "kernels": str(self.precision.get("kernels", "")),
            "auto": list(self.auto),
            "notes": self.notes(),
            "train_tokens": self.data_tokens[0],
            "val_tokens": self.data_tokens[1],
        }

    def notes(self) -> list[str]:
        """What start_info tells about settings this run cannot act on."""
        notes = []
        patience = self.cfg.resolved_early_stopping_patience
        if patience > 0 and self.make_val_sampler is None:
            notes.append(
                f"early_stopping_patience {patience} does nothing in this run: it has no validation "
                "data. Set val_fraction above 0 or give a validation file to stop at the best."
            )
        notes += self._validation_notes()
        warmup, total = self.cfg.warmup_steps, self.total_steps
        if warmup is not None and warmup >= total > 0:
            peak = lr_at(total - 1, self.cfg, total)
            notes.append(
                f"warmup_steps {warmup} is not below the run's {total:,} steps: the learning rate rises "
                f"for the whole run and ends at {peak:.3g}, short of learning_rate {self.cfg.learning_rate:g}. "
                "Use fewer warmup steps, or leave warmup_steps unset (auto: a tenth of the run, at most 100)."
            )
        if self.fresh_optimizer:
            notes.append(
                f"the checkpoint this run resumes holds no optimizer state (a downloaded checkpoint holds "
                f"none), so the {self.cfg.optimizer} optimizer starts afresh at step {self.step:,}; the "
                "weights, the step, the data order and the learning rate schedule go on"
            )
        asked, learned = self.cfg.resolved_vocab_size, self.tokenizer.vocab_size
        if self.cfg.tokenizer == "bpe" and self.tokenizer.kind == "bpe" and learned < asked:
            notes.append(
                f"vocab_size {asked:,}: the BPE tokenizer found only {learned:,} tokens' worth of merges in "
                f"this data, so the model's vocabulary is {learned:,}. More (or more varied) data gives more."
            )
        return notes

    def _validation_notes(self) -> list[str]:
        """Validation data the run holds out but never evaluates; a val_fraction a validation file
        overrides."""
        val_tokens, fraction = self.data_tokens[1], self.cfg.val_fraction
        if self.held_out and val_tokens > 0 and self.cfg.resolved_eval_every <= 0:
            return [
                f"eval_every 0: nothing evaluates the {val_tokens:,} tokens val_fraction {fraction:g} holds "
                "out of the training data, and nothing trains on them. Set val_fraction 0 to train on "
                "all of it, or eval_every above 0 to evaluate on them"
            ]
        if not self.held_out and val_tokens > 0 and fraction != DEFAULT_VAL_FRACTION:
            return [
                f"val_fraction {fraction:g} does nothing in this run: the validation file is its "
                "validation data, and the whole training file trains"
            ]
        return []

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self, *, optimizer: bool, buffers: HostBuffers | None) -> CheckpointSnapshot | None:
        """The current step's checkpoint contents (trainer.checkpoint_snapshot); `optimizer` False:
        weights only. Sharded: every rank calls it (the state is gathered); None except on rank 0."""
        extra = {"scaler": self.scaler.state_dict()} if self.scaler.is_enabled() else {}
        model, opt = self.model, self.optimizer
        if self.sharded:
            from trainer.run.fsdp import full_copies

            copies = full_copies(self)
            if copies is None:
                return None
            (model, opt), buffers = copies, None  # gathered into private copies already
        return take_snapshot(
            model=model,
            model_config=self.model_cfg,
            train_config=self.cfg,
            tokenizer=self.tokenizer,
            state={
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "best_val_loss": self.best_val_loss,
                "best_step": self.best_step,
                "evals_since_best": self.evals_since_best,
                "sampler": self.sampler.state_dict(),
                "total_steps": self.total_steps,
                "precision": self.precision,
            },
            optimizer=opt if optimizer else None,
            extra_meta=extra,
            buffers=buffers,
        )

    def save(self, path: Path, *, optimizer: bool = True) -> Path:
        """A complete checkpoint folder of the current step at `path` (final/, best/ or a step), now."""
        snapshot = self.snapshot(optimizer=optimizer, buffers=None)
        return write_snapshot(snapshot, path) if snapshot is not None else path

    def save_in_background(
        self,
        path: Path,
        *,
        optimizer: bool = True,
        after: Callable[[], None] | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Like `save`, but the folder is written by the background writer while training goes on,
        which then runs `then`; `after` runs on this thread once both are done
        (trainer.run.checkpoint_writer)."""

        def take(buffers: HostBuffers) -> CheckpointSnapshot | None:
            return self.snapshot(optimizer=optimizer, buffers=buffers)

        self.writer.save(take, path, after, then)

    def between_steps(self) -> str | None:
        """A checkpoint finished in the background goes to the callbacks; compile auto decides
        once it has timed the first steps, and then the blocks are captured as CUDA graphs where
        the run asks for them; a CPU run's thread count follows its measured steps
        (trainer.run.cpu_threads) (returned: the decisions, for the run's output). On CUDA,
        after the first step (the optimizer's state exists by then) and once compile auto is done
        timing, the writer pins the snapshots' host buffers in the background, so no checkpoint
        waits for that (one due before then pins its own)."""
        self.writer.poll()
        # compile auto's trial times steps of two kinds on purpose: none of them is a thread trial's
        compile_trial = self.compile_auto is not None
        threads = self.thread_tuner.observe(self.step, compile_trial) if self.thread_tuner else None
        decided = [self._decide_compile(), capture_when_due(self), threads]
        self._reserve_buffers()
        return "; ".join(d for d in decided if d) or None

    def _decide_compile(self) -> str | None:
        auto = self.compile_auto
        if auto is None:
            return None
        choice = auto.observe(self.total_steps - self.step)
        if auto.done:
            self.compile_auto = None
        was_compiled = bool(self.precision.get("compile"))
        if choice is not None:
            compiled = choice.value == "on"
            self.precision.update(compile=compiled, compile_reason=choice.reason)
            self.precision["kernels"] = cpu_kernels.for_run(self.device.type, self.dtype, compiled)
        self._run_blocks_compiled(auto.compiled_next)
        if choice is None:
            return auto.measured if auto.done else None
        decided = f"torch.compile {choice.value} at step {self.step}: {choice.reason}"
        return f"{auto.measured}; {decided}" if was_compiled and auto.measured else decided

    def _run_blocks_compiled(self, compiled: bool) -> None:
        """Regional compilation: each block compiled in place (its first call compiles), or its
        eager forward again; compile auto's trial switches between the two without recompiling."""
        if not self.compiled_blocks:
            if not compiled:
                return
            for block in self.model.layers:
                block.compile()
            self.compiled_blocks = [block._compiled_call_impl for block in self.model.layers]
        for block, compiled_call in zip(self.model.layers, self.compiled_blocks, strict=True):
            block._compiled_call_impl = compiled_call if compiled else None  # what Module.compile() sets

    def _reserve_buffers(self) -> None:
        # not while compile auto times steps: on an H100 it timed llama-110m's eager steps at 244 ms
        # (steady: 50 ms) in the three steps a background thread spent pinning ~1 GB of buffers,
        # and compiled a run too short to pay the compile back
        if self.buffers_planned or self.device.type != "cuda" or not self.optimizer.state:
            return
        if self.compile_auto is not None:
            return
        self.buffers_planned = True
        if self.is_main and not self.sharded and self.cfg.checkpoint_every > 0:
            self.writer.reserve(buffer_plan(self.model, self.model_cfg, self.optimizer))

    def save_step_checkpoint(
        self, reported: Callable[[Path, int], None] | None = None, *, background: bool = False
    ) -> Path:
        """checkpoints/step-XXXXXXXX of the current step; then the newest `keep_checkpoints` are
        kept (only the newest with its optimizer state) and `reported(path, step)` is called."""
        path, step = self.step_checkpoint_path(), self.step

        def rotate() -> None:
            rotate_checkpoints(self.checkpoint_dir, self.cfg.keep_checkpoints)

        def report() -> None:
            if reported is not None:
                reported(path, step)

        if background:
            self.save_in_background(path, after=report, then=rotate)
        else:
            self.writer.wait()
            self.save(path)
            self.writer.at_end += 1
            if self.is_main:
                rotate()
                report()
        self.last_checkpoint_step = step
        return path
