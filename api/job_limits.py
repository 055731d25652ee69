"""What one job may ask for: `check_job_limits` refuses, before anything is written, a job that
could not run on the largest worker of its queue or would run longer than the service allows.

Devices first: `devices: N` needs a worker class of the job's queue with N devices
(`cpu_worker_devices` / `gpu_worker_devices`, the devices of the largest worker of each queue). The
settings, not the live `workers` a deployment happens to run now, decide: admission stays
deterministic (a job is not refused because its worker is restarting, nor accepted because a
bigger one briefly joined); an accepted job waits in `<queue>.<N>` for a worker with N devices.

The limits come from settings: `cpu_worker_memory_bytes` / `gpu_worker_memory_bytes` (the memory of
the largest worker of each queue), `max_job_steps`, `max_job_tokens` (steps x batch_size x grad_accum
x devices x ctx) and `max_checkpoints_per_job`. Every number is trainer.config.estimate's (memory:
weights, gradients, optimizer state, the activations of one micro-batch at the job's dtype,
checkpointing taken into account); this module only compares and words. Where a count depends on the
data (steps from n_epochs), it is an upper bound from the file's token bound, measured at upload
(core.models.File.token_bound, trainer.config.estimate.max_train_tokens), so a refused job could
never have fitted.

Each refusal is a `JobTooLarge` (a HyperparameterError: message + param) naming the field to lower,
the limit and the estimate in GiB or tokens; the route answers it as a 400 `job_too_large`.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass

from api.hyperparams import HyperparameterError
from core.settings import Settings
from trainer.config import ModelConfig, TrainConfig
from trainer.config.data_aware import admission_dropout
from trainer.config.estimate import (
    Device,
    MemoryEstimate,
    estimate_memory,
    eval_tokens,
    evaluations,
    global_batch,
    largest_fitting_batch_size,
    max_train_tokens,
    max_windows_per_epoch,
    parameter_breakdown,
    tokens_per_step,
    total_steps,
    total_tokens,
    with_checkpointing,
)

MiB, GiB = 1 << 20, 1 << 30


class JobTooLarge(HyperparameterError):
    """The job exceeds a limit of the service; `param` is the field to change."""

    code = "job_too_large"


def gib(n_bytes: int) -> str:
    """Bytes for people: GiB with one decimal, MiB below one GiB."""
    if n_bytes < GiB:
        return f"{math.ceil(n_bytes / MiB):,} MiB"
    return f"{n_bytes / GiB:,.1f} GiB"


def check_job_limits(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    *,
    queue: str,
    training_tokens: int,
    has_validation_file: bool,
    given: set[str],
    continuing: bool,
    settings: Settings,
) -> None:
    """JobTooLarge for the first limit the job exceeds: devices, checkpoints kept, steps, tokens,
    memory. `given`: the hyperparameters the request set (to name one of them); `continuing`: the job
    continues a model, so its architecture cannot change."""
    _check_devices(train_cfg.devices, queue, settings)
    _check_checkpoints(train_cfg, settings.max_checkpoints_per_job)
    size = job_size(model_cfg, train_cfg, queue, training_tokens, has_validation_file)
    _check_steps(train_cfg, size.steps, size.windows, settings.max_job_steps)
    _check_tokens(model_cfg, train_cfg, size, settings.max_job_tokens)
    limit = worker_memory_limit(queue, settings)
    _check_memory(model_cfg, size.train_cfg, size.device, queue, limit, given, continuing)


@dataclass(frozen=True)
class JobSize:
    """A job's size as admission counts it (upper bounds where the data decides: see the module
    docstring); the new-job form's live estimate shows the same numbers (api/job_estimate.py)."""

    train_cfg: TrainConfig  # with dropout as auto would decide it (its activations count)
    device: Device
    windows: int  # training windows per epoch, at most
    steps: int
    tokens: int
    eval_tokens: int  # read by its evaluations (0 without validation data)
    memory: MemoryEstimate


def job_size(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    queue: str,
    training_tokens: int,
    has_validation_file: bool,
) -> JobSize:
    train_tokens = max_train_tokens(train_cfg, training_tokens, has_validation_file)
    windows = max_windows_per_epoch(train_tokens, model_cfg.ctx, train_cfg.samples_after_nl)
    steps = total_steps(train_cfg, windows)
    device: Device = "cuda" if queue == "gpu" else "cpu"
    dropout = admission_dropout(train_cfg, train_tokens, model_cfg.num_params())
    sized = train_cfg.model_copy(update={"dropout": dropout})
    memory = estimate_memory(model_cfg, sized, device)
    evaluated = has_validation_file or train_cfg.val_fraction > 0
    validation = eval_tokens(train_cfg, model_cfg.ctx, steps) if evaluated else 0
    return JobSize(
        sized, device, windows, steps, total_tokens(train_cfg, model_cfg.ctx, steps), validation, memory
    )


def worker_memory_limit(queue: str, settings: Settings) -> int:
    """The memory of the largest worker of a training queue (cpu or gpu)."""
    return settings.gpu_worker_memory_bytes if queue == "gpu" else settings.cpu_worker_memory_bytes


def worker_devices_limit(queue: str, settings: Settings) -> int:
    """The devices of the largest worker of a training queue (cpu or gpu)."""
    return settings.gpu_worker_devices if queue == "gpu" else settings.cpu_worker_devices


def _check_devices(devices: int, queue: str, settings: Settings) -> None:
    limit = worker_devices_limit(queue, settings)
    if devices > limit:
        raise JobTooLarge(
            f"devices={devices} is more than the {limit} device{'s' if limit != 1 else ''} of the largest "
            f"{queue} worker (FROMSCRATCH_{queue.upper()}_WORKER_DEVICES): no worker could run this job. "
            f"Use devices <= {limit}.",
            "devices",
        )


def _check_checkpoints(train_cfg: TrainConfig, limit: int) -> None:
    if train_cfg.keep_checkpoints > limit:
        raise JobTooLarge(
            f"keep_checkpoints={train_cfg.keep_checkpoints} is more than the {limit} step checkpoints a job "
            f"may keep (FROMSCRATCH_MAX_CHECKPOINTS_PER_JOB). Use keep_checkpoints <= {limit}.",
            "keep_checkpoints",
        )


def _length_param(train_cfg: TrainConfig) -> str:
    """The field that sets the job's length: max_steps wins over n_epochs (as in the trainer)."""
    return "n_epochs" if train_cfg.max_steps is None and train_cfg.n_epochs is not None else "max_steps"


def check_max_steps(max_steps: object, limit: int) -> None:
    """A requested max_steps over the service's limit, checked before the trainer's own bound (10^7)
    would answer in other words: a job too long is refused in the same words whatever its length."""
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > limit:
        _too_many_steps(
            max_steps, f"max_steps={max_steps:,}", f"Use max_steps <= {limit:,}.", limit, "max_steps"
        )


def _too_many_steps(steps: int, how: str, fix: str, limit: int, param: str) -> typing.NoReturn:
    raise JobTooLarge(
        f"The job would run up to {steps:,} optimizer steps ({how}), more than the {limit:,} steps a job "
        f"may run (FROMSCRATCH_MAX_JOB_STEPS). {fix}",
        param,
    )


def _check_steps(train_cfg: TrainConfig, steps: int, windows: int, limit: int) -> None:
    if steps <= limit:
        return
    if _length_param(train_cfg) == "n_epochs":
        how = (
            f"n_epochs={train_cfg.n_epochs} over up to {windows:,} windows of the training file, "
            f"batch_size x grad_accum x devices = {global_batch(train_cfg)} per step"
        )
        fix = "Lower n_epochs, or raise batch_size or grad_accum (fewer, larger steps)."
    else:
        how = f"max_steps={steps:,}" if train_cfg.max_steps is not None else "the default length"
        fix = f"Use max_steps <= {limit:,}."
    _too_many_steps(steps, how, fix, limit, _length_param(train_cfg))


def _check_tokens(model_cfg: ModelConfig, train_cfg: TrainConfig, size: JobSize, limit: int) -> None:
    """Training and evaluation tokens together within max_job_tokens; the refusal names what to
    lower: the evaluations when they are the larger part, else the training."""
    steps, tokens, validation = size.steps, size.tokens, size.eval_tokens
    if tokens + validation <= limit:
        return
    if validation > tokens:
        raise JobTooLarge(
            f"The job's evaluations would read up to {validation:,} validation tokens "
            f"({evaluations(train_cfg, steps):,} evaluations x eval_batches {train_cfg.eval_batches} x "
            f"batch_size {train_cfg.batch_size} x ctx {model_cfg.ctx}) beside {tokens:,} training tokens, "
            f"more than the {limit:,} tokens a job may process (FROMSCRATCH_MAX_JOB_TOKENS). Lower "
            "eval_batches, or evaluate less often (a larger eval_every).",
            "eval_batches",
        )
    per_step = tokens_per_step(train_cfg, model_cfg.ctx)
    given_length = train_cfg.max_steps is not None or train_cfg.n_epochs is not None
    param = _length_param(train_cfg) if given_length else "batch_size"
    fix = (
        f"Lower max_steps (<= {limit // per_step:,} at this batch), batch_size, grad_accum or ctx."
        if param == "max_steps"
        else "Lower n_epochs, batch_size, grad_accum or ctx."
        if param == "n_epochs"
        else "Lower batch_size, grad_accum or ctx, or set a smaller max_steps."
    )
    also = f", and {validation:,} validation tokens its evaluations read" if validation else ""
    raise JobTooLarge(
        f"The job would process up to {tokens:,} training tokens ({steps:,} steps x batch_size "
        f"{train_cfg.batch_size} x grad_accum {train_cfg.grad_accum} x devices {train_cfg.devices} x ctx "
        f"{model_cfg.ctx}){also}, more than the {limit:,} tokens a job may process "
        f"(FROMSCRATCH_MAX_JOB_TOKENS). {fix}",
        param,
    )


def _check_memory(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    device: Device,
    queue: str,
    limit: int,
    given: set[str],
    continuing: bool,
) -> None:
    est = estimate_memory(model_cfg, train_cfg, device)
    if est.total <= limit:
        return
    dtype = "float32" if est.dtype_bytes == 4 else "16-bit"
    needs = (
        f"The job needs about {gib(est.total)} of memory ({gib(est.weights)} weights, {gib(est.gradients)} "
        f"gradients, {gib(est.optimizer)} optimizer state (optimizer={train_cfg.optimizer}), "
        f"{gib(est.activations)} activations "
        f"for a micro-batch of batch_size={train_cfg.batch_size} x ctx={model_cfg.ctx} tokens in {dtype}"
        f"{_with_dropout(train_cfg, device)}), "
        f"more than the largest {queue} worker has ({gib(limit)}, "
        f"FROMSCRATCH_{queue.upper()}_WORKER_MEMORY_BYTES)."
    )
    param, fix = _memory_fix(model_cfg, train_cfg, device, limit, est, given, continuing)
    raise JobTooLarge(f"{needs} {fix}", param)


def _with_dropout(train_cfg: TrainConfig, device: Device) -> str:
    """Dropout's part in the activations, said where it is large: on the CPU, which keeps
    attention's probabilities for it (the job's own dropout, or what auto will decide)."""
    if not train_cfg.dropout or device != "cpu":
        return ""
    return f" with dropout {train_cfg.dropout:g}, which keeps attention's probabilities on the CPU"


def _memory_fix(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    device: Device,
    limit: int,
    est: MemoryEstimate,
    given: set[str],
    continuing: bool,
) -> tuple[str, str]:
    """(field, advice): the model itself when its states alone do not fit, else the micro-batch."""
    states = est.states_peak
    if states + est.runtime > limit:
        model = (
            f"The model alone ({est.n_params:,} parameters) needs {gib(states)} for its weights, gradients "
            "and optimizer state."
        )
        if continuing:
            return "model", f"{model} Continue a smaller model, or start from a smaller preset."
        return _largest_part(model_cfg, given), f"{model} Lower n_embd, n_layer or ffn_dim (a smaller model)."
    fitting = largest_fitting_batch_size(model_cfg, train_cfg, device, limit)
    checkpointing = "" if train_cfg.activation_checkpointing else ", or set activation_checkpointing=true"
    if fitting >= 1:
        return "batch_size", (
            f"Use batch_size <= {fitting} (raise grad_accum to keep the same batch per step), "
            f"a shorter ctx{_dropout_fix(model_cfg, train_cfg, device, limit)}{checkpointing}."
        )
    smallest = estimate_memory(model_cfg, with_checkpointing(train_cfg), device, batch_size=1)
    if not train_cfg.activation_checkpointing and smallest.total <= limit:
        return "activation_checkpointing", (
            "Set activation_checkpointing=true (recompute activations in the backward pass), "
            "or lower ctx or the model size."
        )
    return "ctx", f"Lower ctx (one window of {model_cfg.ctx} tokens does not fit) or the model size."


def _dropout_fix(model_cfg: ModelConfig, train_cfg: TrainConfig, device: Device, limit: int) -> str:
    """The advice `, dropout=0 (...)` where the job fits without dropout: on the CPU its masks keep
    attention's probabilities, often the largest activation (llama-42m on 1 MB of text: 23 GiB with
    it, 8 without)."""
    if not train_cfg.dropout or device != "cpu":
        return ""
    without = estimate_memory(model_cfg, train_cfg.model_copy(update={"dropout": 0.0}), device)
    return f", dropout=0 (it then needs about {gib(without.total)})" if without.total <= limit else ""


def _largest_part(model_cfg: ModelConfig, given: set[str]) -> str:
    """The architecture field to lower: the one behind the largest share of the parameters (and
    buffers), preferring one the request set over one that came from the preset."""
    breakdown = parameter_breakdown(model_cfg)
    parts = {
        "ffn_dim": breakdown.feed_forward,
        "n_embd": breakdown.attention,
        "vocab_size": breakdown.embeddings,  # the API's vocab_size: the tokenizer's, which the model takes
        "ctx": breakdown.rope_buffers,
    }
    largest = max(parts, key=lambda k: parts[k])
    if largest in given:
        return largest
    if largest in ("ffn_dim", "n_embd") and "n_layer" in given and "n_embd" not in given:
        return "n_layer"
    return "n_embd" if largest != "ctx" else "ctx"
