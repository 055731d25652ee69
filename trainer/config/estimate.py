"""What a training run will need, from its configs alone: memory at the peak of a step
(`estimate_memory`), total work (`total_steps`, `tokens_per_step`, `total_tokens`), the data it
trains on (`max_train_tokens`, `held_out_tokens`) and where its parameters are
(`parameter_breakdown`). Torch-free, so the API admits or refuses a job with it before anything is
queued; api/job_limits.py only words the refusals. The trainer uses the same functions for what it
actually does (steps, tokens per step, the validation hold-out), so the bounds cannot drift from it.

Memory, in bytes, on the device that trains (host RAM for a CPU job, GPU memory for a CUDA job):
- weights: fp32 parameters (autocast keeps fp32 master weights) + the RoPE cos/sin buffers;
- gradients: fp32, one per parameter;
- optimizer: AdamW's exp_avg and exp_avg_sq (fp32) + a float32 step scalar per parameter tensor;
  with muon, the blocks' matrices hold one momentum buffer (fp32) instead, the rest AdamW's state;
  L-BFGS's history (2 x LBFGS_HISTORY_SIZE flat vectors) and its working vectors;
- activations: what autograd saves for the backward pass of one micro-batch of batch_size windows
  of ctx tokens, counted tensor by tensor from trainer/model/llama.py's forward (an upper bound of what
  `torch.autograd.graph.saved_tensors_hooks` sees; tests/trainer/test_estimate.py checks it). With
  activation checkpointing: every block's input plus one block recomputed during the backward;
- backward working memory: the largest set of gradients alive at once beyond the saved tensors
  (the logits' gradients, or one block's). Where the loss runs fused with the output projection
  (trainer.config.fused_loss: CUDA by default) no logits are saved, only the weight's gradient, and
  the working memory is one chunk's logits instead of all of them (`_loss_bytes`);
- batch: the step's token ids (all batch_size x grad_accum windows are drawn at once, int64);
- runtime: a fixed allowance for the Python process, torch and kernel workspaces.
Writing a checkpoint serialises the optimizer state into one more host copy while the gradients
are freed; on a CPU job that phase can be the peak, so the total is the larger of the two phases.

The matmuls run in the compute dtype (2 bytes under bf16/fp16 autocast, 4 in float32); the residual
stream, RMSNorm statistics and the loss stay in float32; on CPU attention runs in float32. The
attention kernel is a fused one (flash / memory-efficient): no ctx x ctx score matrix is stored,
except on CPU with dropout, where SDPA falls back to its math path (`_dropout_activations`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from trainer.config import ModelConfig, TrainConfig
from trainer.config.data_aware import auto_eval_every
from trainer.config.fused_loss import chunk_rows, fused_cross_entropy_on

Device = Literal["cpu", "cuda"]

DEFAULT_TOTAL_STEPS = 1000  # neither max_steps nor n_epochs given
LBFGS_HISTORY_SIZE = 16  # trainer.optim.optimizers's L-BFGS keeps this many update pairs
RUNTIME_BYTES = 512 << 20  # Python, torch, CPU/CUDA kernel workspaces
FP32 = 4
INT64 = 8


def compute_dtype_name(cfg: TrainConfig, device: Device) -> str:
    """The matmuls' dtype: trainer.run.precision.choose_dtype's choice (auto is bfloat16 on CUDA; on
    CPU float32, the larger of its two choices)."""
    if cfg.dtype == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    return cfg.dtype


def compute_dtype_bytes(cfg: TrainConfig, device: Device) -> int:
    """Bytes per element of the matmuls (compute_dtype_name's)."""
    return FP32 if compute_dtype_name(cfg, device) == "float32" else 2


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each part at a training step's peak (see the module docstring); `total` is the peak."""

    n_params: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    backward_working: int
    batch: int
    checkpoint_copy: int  # host copy of the optimizer state while a checkpoint is written (CPU jobs)
    runtime: int = RUNTIME_BYTES
    dtype_bytes: int = FP32

    @property
    def model_states(self) -> int:
        """Weights + gradients + optimizer state: what no batch size or checkpointing can lower."""
        return self.weights + self.gradients + self.optimizer

    @property
    def training_peak(self) -> int:
        return self.model_states + self.activations + self.backward_working + self.batch + self.runtime

    @property
    def checkpoint_peak(self) -> int:
        return self.weights + self.optimizer + self.checkpoint_copy + self.batch + self.runtime

    @property
    def total(self) -> int:
        return max(self.training_peak, self.checkpoint_peak)

    @property
    def states_peak(self) -> int:
        """The larger phase's share that no batch size or checkpointing can lower: model_states while
        training, weights + optimizer state + its host copy while a checkpoint is written."""
        return max(self.model_states, self.weights + self.optimizer + self.checkpoint_copy)


def n_param_tensors(model_cfg: ModelConfig) -> int:
    """Parameter tensors of trainer.model.llama.Llama: 9 per block (wq, wk, wv, wo, w1, w2, w3 and two
    norms), the embedding, the final norm and the output projection unless it is tied."""
    return 9 * model_cfg.n_layer + 2 + (0 if model_cfg.tie_embeddings else 1)


def weight_bytes(model_cfg: ModelConfig) -> int:
    """fp32 parameters + the RoPE cos/sin buffers (ctx x n_rot each, float32)."""
    parts = parameter_breakdown(model_cfg)
    return FP32 * (parts.parameters + parts.rope_buffers)


def optimizer_bytes(model_cfg: ModelConfig, cfg: TrainConfig) -> int:
    n = model_cfg.num_params()
    if cfg.optimizer == "lbfgs":
        # history of steps and gradient differences, plus the direction, the previous flat gradient,
        # the current flat gradient, the line search's copy of the weights and its evaluations
        return FP32 * n * (2 * LBFGS_HISTORY_SIZE + 6)
    if cfg.optimizer == "muon":  # trainer.optim.muon.is_hidden_matrix: 7 matrices per block
        parts = parameter_breakdown(model_cfg)
        matrices = parts.attention + parts.feed_forward
        adamw_tensors = n_param_tensors(model_cfg) - 7 * model_cfg.n_layer
        return FP32 * matrices + 2 * FP32 * (n - matrices) + FP32 * adamw_tensors
    return 2 * FP32 * n + FP32 * n_param_tensors(model_cfg)


def _block_activations(
    model_cfg: ModelConfig, tokens: int, c: int, a: int, autocast: bool, cuda_kernels: bool = False
) -> int:
    """Bytes one block saves for its backward, beyond its input: `tokens` = batch_size x ctx,
    c = compute dtype bytes, a = attention dtype bytes. cuda_kernels: CUDA's eager step, whose
    hand-written functions (trainer.model.triton_ops) keep less: a norm its input, not a float32
    normalised copy; SwiGLU its input, not silu(gate); v a copy while the projection is freed.
    On an H100 this put the estimate 1-21% above the measured peaks (bench/README.md), where
    counting those tensors put it 30-46% above."""
    d, hd, h = model_cfg.n_embd, model_cfg.head_dim, model_cfg.hidden_dim
    heads, kv = model_cfg.n_head, model_cfg.kv_heads
    normalised = 0 if cuda_kernels else FP32 * tokens * d
    norm = FP32 * tokens + normalised + c * tokens * d  # rsqrt, normalised x, output
    attention = (
        norm
        + c * d * (heads + 2 * kv) * hd  # q|k|v weights concatenated per call
        + c * tokens * (heads + 2 * kv) * hd  # the q|k|v projection (v is a view of it)
        + a * tokens * (heads + kv) * hd  # q and k after RoPE
        + (0 if cuda_kernels else a * tokens * kv * hd)  # v in the attention dtype
        + a * tokens * heads * hd  # attention output
        + FP32 * tokens * heads  # its log-sum-exp
        + c * tokens * heads * hd  # wo's input
        + (c * d * heads * hd if autocast else 0)  # wo's weight cast to the compute dtype
    )
    residual = FP32 * tokens * d  # x + attention(...), saved by the second norm
    feed_forward = (
        norm
        + c * 2 * h * d  # w1|w3 weights concatenated per call
        + c * tokens * 2 * h  # gate|up
        + (0 if cuda_kernels else c * tokens * h)  # silu(gate)
        + c * tokens * h  # silu(gate) * up, w2's input
        + (c * h * d if autocast else 0)  # w2's weight cast
    )
    return attention + residual + feed_forward


def _dropout_activations(model_cfg: ModelConfig, tokens: int, c: int, a: int, device: Device) -> int:
    """Bytes dropout (TrainConfig.dropout > 0) adds to one block's saved tensors: the masks of both
    residual branches (in the compute dtype on CPU; CUDA's fused kernel keeps a byte per element).
    On CPU, torch's flash kernel has no dropout, so SDPA runs its math path: the ctx x ctx attention
    probabilities, their mask and the dropped probabilities, and q, k and v with every head (counted
    on top of the fused kernel's tensors, an upper bound). CUDA's fused kernels regenerate their
    attention mask in the backward pass."""
    masks = 2 * c * tokens * model_cfg.n_embd
    if device == "cuda":
        return masks
    heads = model_cfg.n_head
    return masks + 3 * a * tokens * heads * (model_cfg.ctx + model_cfg.head_dim)


def _loss_bytes(
    model_cfg: ModelConfig, cfg: TrainConfig, device: Device, tokens: int, c: int
) -> tuple[int, int]:
    """(saved, working): the bytes the output projection + cross-entropy save for the backward, and
    the most they allocate beyond that at once. Plain: the cast weight and the float32 logits'
    log-softmax; working, the logits' gradient before and after the float32 cast (and the logits).
    Fused (trainer.config.fused_loss, trainer.model.linear_cross_entropy): the weight's float32
    gradient; working, one chunk's float32 logits and log-softmax (and a copy in the compute dtype;
    on CUDA only that copy, which the Triton kernel overwrites with its gradient) with the cast
    weight and a chunk's weight gradient, or the backward's scaled gradients."""
    d, vocab, autocast = model_cfg.n_embd, model_cfg.vocab_size, c != FP32
    if not fused_cross_entropy_on(device, compute_dtype_name(cfg, device)):
        saved = (c * vocab * d if autocast else 0) + FP32 * tokens * vocab
        return saved, 3 * FP32 * tokens * vocab + (c * tokens * vocab if autocast else 0)
    rows = chunk_rows(tokens, vocab)
    # on CUDA (Triton's kernel) the logits in the compute dtype alone, else float32 copies beside them
    per_logit = c if device == "cuda" else 2 * FP32 + (c if autocast else 0)
    forward = per_logit * rows * vocab + (2 * c * vocab * d if autocast else 0)
    backward = FP32 * vocab * d + c * tokens * d
    return FP32 * vocab * d, max(forward + INT64 * tokens, backward)


def estimate_memory(
    model_cfg: ModelConfig, cfg: TrainConfig, device: Device, *, batch_size: int | None = None
) -> MemoryEstimate:
    """The peak memory of a training step of this run on `device` (see the module docstring).
    `batch_size` overrides cfg.batch_size (to find the largest micro-batch that fits)."""
    micro = cfg.batch_size if batch_size is None else batch_size
    c = compute_dtype_bytes(cfg, device)
    autocast = c != FP32
    a = FP32 if device == "cpu" else c  # CPU attention runs in float32 (trainer.model.llama.Attention)
    d, n_layer = model_cfg.n_embd, model_cfg.n_layer
    tokens = micro * model_cfg.ctx
    loss_saved, loss_working = _loss_bytes(model_cfg, cfg, device, tokens, c)
    residual = FP32 * tokens * d  # a block's input (the fp32 residual stream)
    block = _block_activations(model_cfg, tokens, c, a, autocast, cuda_kernels=device == "cuda")
    embedding_mask = 0
    if cfg.dropout != 0:  # auto (None) may turn it on: its masks are counted
        block += _dropout_activations(model_cfg, tokens, c, a, device)
        embedding_mask = FP32 * tokens * d  # the float32 embedding output's
    head = (
        2 * INT64 * tokens  # token ids (the embedding) and targets (the loss)
        + residual  # the last block's output
        + FP32 * tokens
        + FP32 * tokens * d
        + c * tokens * d  # final RMSNorm (or, fused, the gradient that takes the place of its output)
        + loss_saved
        + embedding_mask
    )
    if cfg.activation_checkpointing:
        # block inputs, one block recomputed; autocast caches every block's weight casts in the forward
        casts = n_layer * c * d * (model_cfg.n_head * model_cfg.head_dim + model_cfg.hidden_dim)
        activations = head + n_layer * residual + block + (casts if autocast else 0)
    else:
        activations = head + n_layer * (residual + block)
    # a block's backward: at most one gradient per saved tensor; plus the residual's gradient
    backward_working = max(loss_working, block) + 2 * residual
    step_windows = micro * cfg.grad_accum
    if device == "cpu":  # the step's x and y, and the next step's being drawn (indices and windows)
        batch = 4 * INT64 * step_windows * (model_cfg.ctx + 1)
    else:  # x and y on the device
        batch = 2 * INT64 * step_windows * model_cfg.ctx
    optimizer = optimizer_bytes(model_cfg, cfg)
    n = model_cfg.num_params()
    return MemoryEstimate(
        n_params=n,
        weights=weight_bytes(model_cfg),
        gradients=FP32 * n,
        optimizer=optimizer,
        activations=activations,
        backward_working=backward_working,
        batch=batch,
        checkpoint_copy=optimizer if device == "cpu" else 0,
        dtype_bytes=c,
    )


def largest_fitting_batch_size(model_cfg: ModelConfig, cfg: TrainConfig, device: Device, limit: int) -> int:
    """The largest batch_size <= cfg.batch_size whose estimate fits in `limit` bytes (0: none)."""
    lo, hi = 0, cfg.batch_size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_memory(model_cfg, cfg, device, batch_size=mid).total <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def with_checkpointing(cfg: TrainConfig) -> TrainConfig:
    """cfg with activation checkpointing on (to see whether turning it on would make a job fit)."""
    return cfg.model_copy(update={"activation_checkpointing": True})


def held_out_tokens(n_tokens: int, val_fraction: float) -> int:
    """Tokens trainer.data.prepare.prepare_data holds out for validation when there is no validation
    file: the last int(n_tokens x val_fraction)."""
    return int(n_tokens * val_fraction)


def max_train_tokens(cfg: TrainConfig, file_tokens: int, has_validation_file: bool) -> int:
    """An upper bound of the training tokens of a file that gives at most `file_tokens` tokens
    (trainer.data.formats.FileSummary.max_tokens): all of them with a validation file, else what is
    left after the hold-out (which never shrinks as the file grows)."""
    return (
        file_tokens if has_validation_file else file_tokens - held_out_tokens(file_tokens, cfg.val_fraction)
    )


def max_windows_per_epoch(n_tokens: int, ctx: int, samples_after_nl: bool) -> int:
    """An upper bound of trainer.data.batches.BatchSampler's windows per epoch for `n_tokens` training
    tokens (exact without samples_after_nl: windows start every ctx tokens; with it, at most every
    possible start is a line start)."""
    n_starts = n_tokens - ctx  # starts whose window of ctx + 1 tokens fits
    if n_starts <= 0:
        return 0
    return n_starts if samples_after_nl else math.ceil(n_starts / ctx)


def total_steps(cfg: TrainConfig, windows_per_epoch: int) -> int:
    """Optimizer steps of a run: max_steps, else enough whole global batches (`global_batch`) to visit
    every window n_epochs times (trainer.data.batches.BatchSampler.steps_for_epochs), else
    DEFAULT_TOTAL_STEPS."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    if cfg.n_epochs is not None:
        return max(1, math.ceil(cfg.n_epochs * windows_per_epoch / global_batch(cfg)))
    return DEFAULT_TOTAL_STEPS


def global_batch(cfg: TrainConfig) -> int:
    """Windows per optimizer step over all processes: batch_size is per process (per micro-batch)."""
    return cfg.batch_size * cfg.grad_accum * cfg.devices


def tokens_per_step(cfg: TrainConfig, ctx: int) -> int:
    """Training tokens of one optimizer step over all processes (batch_size x grad_accum x devices x ctx)."""
    return global_batch(cfg) * ctx


def total_tokens(cfg: TrainConfig, ctx: int, steps: int) -> int:
    """Training tokens a run of `steps` steps processes."""
    return steps * tokens_per_step(cfg, ctx)


def evaluations(cfg: TrainConfig, steps: int) -> int:
    """Evaluations a run of `steps` steps makes when it has validation data: one every eval_every
    steps and at the last (auto: as trainer.config.data_aware decides it from the steps; 0: none)."""
    every = cfg.eval_every if cfg.eval_every is not None else int(auto_eval_every(steps).value)
    return -(-steps // every) if every > 0 and steps > 0 else 0


def eval_tokens(cfg: TrainConfig, ctx: int, steps: int) -> int:
    """Validation tokens those evaluations read: eval_batches x batch_size x ctx each (rank 0 alone
    evaluates). The final full pass over the validation data is bounded by the data, not counted."""
    return evaluations(cfg, steps) * cfg.eval_batches * cfg.batch_size * ctx


@dataclass(frozen=True)
class ParameterBreakdown:
    """Where a model's parameters are (their sum is ModelConfig.num_params), plus the RoPE buffers."""

    attention: int  # wq, wk, wv, wo of every block
    feed_forward: int  # w1, w2, w3 of every block
    norms: int  # two RMSNorm weights per block and the final one
    embeddings: int  # the token embedding, and the output projection unless it is tied
    rope_buffers: int  # the cos/sin tables: elements, not parameters

    @property
    def parameters(self) -> int:
        return self.attention + self.feed_forward + self.norms + self.embeddings


def parameter_breakdown(model_cfg: ModelConfig) -> ParameterBreakdown:
    d, layers = model_cfg.n_embd, model_cfg.n_layer
    kv = model_cfg.kv_heads * model_cfg.head_dim
    return ParameterBreakdown(
        attention=layers * (2 * d * d + 2 * d * kv),
        feed_forward=layers * 3 * d * model_cfg.hidden_dim,
        norms=(2 * layers + 1) * d,
        embeddings=model_cfg.vocab_size * d * (1 if model_cfg.tie_embeddings else 2),
        rope_buffers=2 * model_cfg.ctx * model_cfg.n_rot,
    )
