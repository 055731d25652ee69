"""Everything before the first training step: `start_run` turns train()'s arguments into a `TrainRun`.

The order matters for reproducibility: the global RNGs are seeded right before the model is built
(its initial weights come from them), and a resumed run then restores the RNG states, optimizer,
gradient scaler and sampler position from its checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from trainer.checkpoint import (
    Checkpoint,
    latest_checkpoint,
    load_checkpoint,
    load_optimizer_state,
    set_rng_state,
)
from trainer.checkpoint_snapshot import has_optimizer_state
from trainer.config import ConfigError, ModelConfig, TrainConfig, schema
from trainer.config.data_aware import resolve_auto
from trainer.config.estimate import global_batch, tokens_per_step, total_steps
from trainer.model import cpu_kernels
from trainer.model.llama import Llama
from trainer.optim.optimizers import make_optimizer
from trainer.run.collectives import check_devices, local_rank, rank_and_world
from trainer.run.compile_memory import REGIONAL_COMPILE, compile_memory, shape_key
from trainer.run.cpu_threads import thread_tuner
from trainer.run.measured_compile import MEASURE_STEPS, MeasuredCompile
from trainer.run.precision import DTYPES, Choice, choose_compile, choose_dtype, resumed_dtype
from trainer.run.state import TrainRun

if TYPE_CHECKING:  # trainer.data.prepare is imported lazily: it keeps `import trainer.run.loop` light
    from trainer.data.batches import Batch
    from trainer.data.prepare import BatchSampler, TokenData
    from trainer.data.tokenizers import Tokenizer

NEWLINE_ID = 10  # byte 10 is id 10 in both the byte and the BPE tokenizer


def start_run(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    train_path: str | os.PathLike[str] | TokenData,
    out_dir: Path,
    *,
    tokenizer: Tokenizer | None,
    validation_path: str | os.PathLike[str] | None,
    resume: bool | Path,
    init_from: Path | None,
) -> TrainRun:
    """Check the config, pick the starting point, prepare the data, build model and optimizer,
    and restore a resumed run's state. Data errors are raised here, before any training."""
    rank, world = check_process_group(cfg)
    device = resolve_device(cfg)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank())
    out_dir.mkdir(parents=True, exist_ok=True)
    resume_path = resume_checkpoint_path(out_dir, resume)
    resumed = load_checkpoint(resume_path) if resume_path is not None else None
    check_same_optimizer(cfg, resumed)
    dtype_choice = resumed_dtype(cfg, resumed, device) or choose_dtype(cfg, device)
    source = resumed or (load_checkpoint(init_from) if init_from is not None else None)
    if source is not None:  # the checkpoint's model and tokenizer win over the arguments
        cfg, model_cfg, tokenizer = from_source(cfg, source)
    data, tokenizer = load_data_in_turn(cfg, train_path, tokenizer, validation_path, out_dir, rank, world)
    if model_cfg.vocab_size != tokenizer.vocab_size:
        model_cfg = model_cfg.model_copy(update={"vocab_size": tokenizer.vocab_size})
    sampler = train_sampler(cfg, model_cfg.ctx, data)
    steps = total_steps_for(cfg, sampler)
    cfg, auto = decide_auto(cfg, model_cfg, data, steps)
    make_val_sampler = val_sampler_factory(cfg, model_cfg.ctx, data)
    model = build_model(cfg, model_cfg, source, device)  # seeds the global RNGs, then initializes
    run = TrainRun(
        cfg=cfg,
        model_cfg=model_cfg,
        tokenizer=tokenizer,
        out_dir=out_dir,
        device=device,
        dtype=DTYPES[dtype_choice.value],
        model=model,
        fwd=model,
        optimizer=make_optimizer(model, cfg),
        scaler=torch.amp.GradScaler(device.type, enabled=DTYPES[dtype_choice.value] == torch.float16),
        sampler=sampler,
        make_val_sampler=make_val_sampler,
        make_full_pass=full_pass_factory(cfg, model_cfg.ctx, data) if make_val_sampler is not None else None,
        total_steps=steps,
        resume_path=resume_path,
        rank=rank,
        world=world,
        auto=auto,
        data_tokens=(len(data.train), 0 if data.val is None else len(data.val)),
        held_out=data.held_out,
    )
    if resumed is not None:
        restore_progress(run, resumed)
    spread_over_ranks(run)
    choose_precision(run, dtype_choice)  # and, on a CPU, the thread count's measurement
    return run


def from_source(cfg: TrainConfig, source: Checkpoint) -> tuple[TrainConfig, ModelConfig, Tokenizer]:
    """The checkpoint a run continues gives its architecture and tokenizer, and the run's config says
    so (the checkpoints it writes are read with it)."""
    update = {field: getattr(source.train_config, field) for field in schema.TOKENIZER_FIELDS}
    return cfg.model_copy(update=update), source.model_config, source.tokenizer


def decide_auto(
    cfg: TrainConfig, model_cfg: ModelConfig, data: TokenData, steps: int
) -> tuple[TrainConfig, list[str]]:
    """The config with its data-aware `auto` settings decided (trainer.config.data_aware), and each
    decision as "field value: reason"."""
    decided, choices = resolve_auto(
        cfg,
        train_tokens=len(data.train),
        val_tokens=0 if data.val is None else len(data.val),
        params=model_cfg.num_params(),
        total_steps=steps,
        tokens_per_step=tokens_per_step(cfg, model_cfg.ctx),
    )
    return decided, [f"{c.field} {c.value}: {c.reason}" for c in choices]


def check_same_optimizer(cfg: TrainConfig, resumed: Checkpoint | None) -> None:
    """A resumed run continues its optimizer's state: another optimizer has none to continue."""
    saved = resumed.train_config.optimizer if resumed is not None else cfg.optimizer
    if saved != cfg.optimizer:
        raise ConfigError(
            [("optimizer", f"the run being resumed trains with {saved}; resume it with optimizer {saved}")]
        )


def check_process_group(cfg: TrainConfig) -> tuple[int, int]:
    """(rank, world) of this process, refusing a config this process group cannot run."""
    if cfg.optimizer == "lbfgs" and cfg.dtype == "float16":
        raise ConfigError(
            [("dtype", "float16 needs a gradient scaler, which L-BFGS cannot use; use bfloat16 or float32")]
        )
    rank, world = rank_and_world()
    if cfg.devices != world:
        raise ValueError(
            f"devices={cfg.devices} runs in {cfg.devices} processes: start it with "
            f"trainer.distributed.launch.launch_train (this process group has {world})"
        )
    check_devices(cfg)
    return rank, world


def spread_over_ranks(run: TrainRun) -> None:
    """Several processes: the model sharded (fsdp) or wrapped in DDP; one process: as it is."""
    if run.world == 1:
        return
    if run.cfg.sharding == "fsdp":
        from trainer.run.fsdp import shard_run

        shard_run(run)
    else:
        run.ddp = wrap_ddp(run.model, run.device)
        run.fwd = run.ddp


def choose_precision(run: TrainRun, dtype_choice: Choice) -> None:
    """Record what dtype auto decided, decide compile auto from the run's estimated length (and
    compile), and pick the element-wise kernels, all saved in checkpoints; a CPU run's thread count
    is measured as it goes (trainer.run.cpu_threads)."""
    flops_per_step = run.model.flops_per_token() * run.tokens_per_step // run.world
    if run.cfg.compile is None and run.world == 1 and run.device.type in REGIONAL_COMPILE:
        # decided from the first steps' times (trainer.run.measured_compile)
        shape = shape_key(run.model_cfg, run.cfg.batch_size, dtype_choice.value)
        sync = torch.cuda.synchronize if run.device.type == "cuda" else lambda: None
        run.compile_auto = MeasuredCompile(
            run.device.type, run.cfg.time_limit, memory=compile_memory(), shape=shape, sync=sync
        )
        compile_choice = Choice("off", f"auto: decided after timing the first {MEASURE_STEPS + 1} steps")
    else:
        compile_choice = choose_compile(
            run.cfg, run.device, dtype_choice.value, flops_per_step, run.total_steps - run.step
        )
    run.thread_tuner = thread_tuner(run.device.type, run.world, torch.get_num_threads())
    compiled = compile_choice.value == "on"
    run.precision = {
        "device": run.device.type,
        "dtype": dtype_choice.value,
        "dtype_reason": dtype_choice.reason,
        "compile": compiled,
        "compile_reason": compile_choice.reason,
        "kernels": cpu_kernels.for_run(run.device.type, run.dtype, compiled),
    }
    if compiled:
        # an OptimizedModule, typed as a callable (DDP is compiled, not wrapped around a compiled model)
        run.fwd = cast(torch.nn.Module, torch.compile(run.fwd))


def wrap_ddp(model: Llama, device: torch.device) -> torch.nn.parallel.DistributedDataParallel:
    """The model in DistributedDataParallel. Buffers (the RoPE tables) are computed alike on every
    rank, so they are not synced each forward; the weights are (identically seeded or loaded)."""
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)


def load_data_in_turn(
    cfg: TrainConfig,
    train_path: str | os.PathLike[str] | TokenData,
    tokenizer: Tokenizer | None,
    validation_path: str | os.PathLike[str] | None,
    out_dir: Path,
    rank: int,
    world: int,
) -> tuple[TokenData, Tokenizer]:
    """load_data; with several processes rank 0 goes first (it trains the tokenizer when there is
    none and fills the token cache) and the others then read its tokenizer and the cache."""
    if world == 1:
        return load_data(cfg, train_path, tokenizer, validation_path, out_dir)
    import torch.distributed as dist

    from trainer.data.tokenizers import tokenizer_from_json

    shared = out_dir / "cache" / "distributed-tokenizer.json"
    if rank == 0:
        data, tokenizer = load_data(cfg, train_path, tokenizer, validation_path, out_dir)
        shared.parent.mkdir(parents=True, exist_ok=True)
        tmp = shared.with_suffix(".tmp")
        tmp.write_text(json.dumps(tokenizer.to_json()))
        tmp.replace(shared)
    dist.barrier()
    if rank != 0:
        tokenizer = tokenizer_from_json(json.loads(shared.read_text()))
        data, tokenizer = load_data(cfg, train_path, tokenizer, validation_path, out_dir)
    assert tokenizer is not None
    return data, tokenizer


def resolve_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError([("device", "cuda was asked for but no CUDA device is available; use auto or cpu")])
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resume_checkpoint_path(out_dir: Path, resume: bool | Path) -> Path | None:
    """The checkpoint to resume from: the newest in out_dir (resume=True; None when there is none)
    or the given folder. A fresh run refuses an out_dir that already holds checkpoints."""
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
    return resume_path


def load_data(
    cfg: TrainConfig,
    train_path: str | os.PathLike[str] | TokenData,
    tokenizer: Tokenizer | None,
    validation_path: str | os.PathLike[str] | None,
    out_dir: Path,
) -> tuple[TokenData, Tokenizer]:
    """(tokens, tokenizer): prepared TokenData as given (with its tokenizer), or a text/JSONL file
    tokenized (training a tokenizer on it first when none is given), cached under out_dir/cache."""
    from trainer.data.prepare import TokenData, prepare_data

    if isinstance(train_path, TokenData):
        if tokenizer is None:
            raise ValueError("train() with prepared TokenData needs the tokenizer that produced it")
        return train_path, tokenizer
    if tokenizer is None:
        from trainer.data.formats import iter_documents
        from trainer.data.tokenizers import train_tokenizer

        tokenizer = train_tokenizer(cfg.tokenizer, cfg.resolved_vocab_size, iter_documents(Path(train_path)))
    data = prepare_data(
        Path(train_path),
        tokenizer,
        validation_path=validation_path,
        val_fraction=cfg.val_fraction,
        cache_dir=out_dir / "cache",
    )
    return data, tokenizer


def loss_spans(cfg: TrainConfig, spans: np.ndarray | None) -> np.ndarray | None:
    """The loss spans the run uses: the data's, or None (every token) with train_on_inputs."""
    return None if cfg.train_on_inputs else spans


def train_sampler(cfg: TrainConfig, ctx: int, data: TokenData) -> BatchSampler:
    """Draws the step's global batch (batch_size * grad_accum * devices windows) at once, on every
    rank (see trainer.run.loop's docstring and trainer.run.collectives): the data order does not
    depend on the split."""
    from trainer.data.prepare import BatchSampler

    return BatchSampler(
        data.train,
        ctx,
        global_batch(cfg),
        seed=cfg.seed,
        samples_after_nl=cfg.samples_after_nl,
        newline_id=NEWLINE_ID,
        epochs=cfg.n_epochs,
        spans=loss_spans(cfg, data.train_spans),
    )


def val_sampler_factory(cfg: TrainConfig, ctx: int, data: TokenData) -> Callable[[], BatchSampler] | None:
    """A maker of identically seeded validation samplers (each evaluation sees the same batches),
    or None when there is no validation data or evaluation is off."""
    from trainer.data.batches import VALIDATION_DATA
    from trainer.data.prepare import BatchSampler

    val = data.val
    if val is None or len(val) == 0 or cfg.resolved_eval_every <= 0:
        return None
    spans = loss_spans(cfg, data.val_spans)

    def make_val_sampler() -> BatchSampler:
        return BatchSampler(val, ctx, cfg.batch_size, seed=cfg.seed + 1, spans=spans, name=VALIDATION_DATA)

    make_val_sampler()  # too short for one window -> DataError now, not at the first evaluation
    return make_val_sampler


def full_pass_factory(cfg: TrainConfig, ctx: int, data: TokenData) -> Callable[[], Iterator[Batch]]:
    """A maker of the final full validation pass: every validation window once, in order."""
    from trainer.data.batches import full_pass

    val = data.val
    assert val is not None  # only made when there is a validation sampler
    spans = loss_spans(cfg, data.val_spans)
    return lambda: full_pass(val, ctx, cfg.batch_size, spans)


def total_steps_for(cfg: TrainConfig, sampler: BatchSampler) -> int:
    """max_steps, else enough whole batches to visit every window n_epochs times (the last batch of
    an epoch runs into the next, as the sampler does), else 1000: trainer.config.estimate's rule, which the
    API also applies to bound a job's work before admitting it."""
    return total_steps(cfg, sampler.windows_per_epoch)


def build_model(
    cfg: TrainConfig, model_cfg: ModelConfig, source: Checkpoint | None, device: torch.device
) -> Llama:
    """A freshly seeded Llama, with the weights of `source` (resume or init_from) when given."""
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)
    model = Llama(model_cfg, init_std=cfg.init_std, dropout=cfg.resolved_dropout)
    if source is not None:
        model.load_state_dict(source.model_state, strict=True)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
    model.to(device)
    model.activation_checkpointing = cfg.activation_checkpointing
    return model


def restore_progress(run: TrainRun, resumed: Checkpoint) -> None:
    """Continue where `resumed` stopped: step, tokens, the best evaluation (loss, step, evaluations
    since: early stopping counts on), optimizer and scaler state, sampler position and the RNG states."""
    st = resumed.state
    run.step, run.tokens_seen = int(st["step"]), int(st["tokens_seen"])
    best_val_loss = st.get("best_val_loss")
    run.best_val = float(best_val_loss) if best_val_loss is not None else math.inf
    # checkpoints written before early stopping existed hold neither: the count starts afresh
    run.best_step, run.evals_since_best = st.get("best_step"), int(st.get("evals_since_best", 0))
    run.last_checkpoint_step = run.step
    if st.get("optimizer_meta") and has_optimizer_state(resumed.path):
        load_optimizer_state(run.optimizer, run.model, resumed.path, st["optimizer_meta"])
        scaler_state = st["optimizer_meta"].get("extra", {}).get("scaler")
        if scaler_state and run.scaler.is_enabled():
            run.scaler.load_state_dict(scaler_state)
    else:  # said at the start (TrainRun.notes): a silent fresh optimizer looks like an exact resume
        run.fresh_optimizer = run.step > 0
    if st.get("sampler") is not None:
        run.sampler.load_state_dict(st["sampler"])
    set_rng_state(st["rng"])
