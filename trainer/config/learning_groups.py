"""TrainConfig's groups about what is learned and how: the weights' start and regularization, the
data, the optimizer and the learning-rate schedule (trainer.config.train composes them)."""

from __future__ import annotations

from typing import Literal

from trainer.config.fields import INT64_MAX, Int, StrictConfig, param

MAX_STEPS = 10_000_000


class InitFields(StrictConfig):
    """How the model's weights start and how training regularizes it; the architecture itself, and so
    the exports, is ModelConfig."""

    init_std: float | None = param(
        None,
        "standard deviation of the initial weights (residual projections: divided by sqrt(2 n_layer))",
        title="Init std",
        gt=0,
        le=1,
        null_means="0.02 x sqrt(768 / n_embd): GPT-2's 0.02 at its width, scaled as 1/sqrt(width)",
    )
    # in training only: evaluation, sampling and exports never drop (trainer.model.llama.drop)
    dropout: float | None = param(
        None,
        "probability of zeroing an element of the embedding output, the attention probabilities and "
        "both residual branches of every block while training (0 = off)",
        title="Dropout",
        ge=0,
        le=0.9,
        null_means="auto: 0 from 1 training token per parameter up, 0.1 down to 0.1, 0.2 below",
        accepts_auto=True,
    )


class DataFields(StrictConfig):
    """What the model reads: tokenizer, batches and what the loss covers."""

    tokenizer: Literal["byte", "bpe"] = param(
        "byte",
        "byte: 256 bytes + BOS/EOS, lossless; bpe: byte-level BPE trained on the data",
        title="Tokenizer",
        advanced=False,
    )
    # the vocabulary asked of the tokenizer; the model's (ModelConfig.vocab_size) follows the tokenizer built
    vocab_size: Int | None = param(
        None,
        "BPE vocabulary size (bpe only)",
        title="Vocab size (bpe)",
        ge=258,  # the byte vocabulary; a BPE needs 260 or more (TrainConfig._cross_field_problems)
        le=65536,
        null_means="258 (byte) / 4096 (bpe)",
        advanced=False,
    )
    # batch = batch_size (micro-batch) * grad_accum sequences of ctx tokens
    batch_size: Int = param(
        16, "sequences per micro-batch", title="Batch size", ge=1, le=4096, accepts_auto=True, advanced=False
    )
    grad_accum: Int = param(
        1,
        "micro-batches accumulated per optimizer step (batch = batch_size x grad_accum)",
        title="Gradient accumulation",
        ge=1,
        le=1024,
    )
    train_on_inputs: bool = param(
        False,
        "train on every token of prompt/completion and chat data, prompts and other roles' messages "
        "too (off: completions and assistant messages only; plain text always trains on all)",
        title="Train on inputs",
    )
    samples_after_nl: bool = param(
        False,
        "start training windows only after a newline (llama.cpp --samples-after-nl)",
        title="Start samples after a newline",
    )
    seed: Int = param(
        1337,
        "random seed (weights init and data order)",
        title="Seed",
        ge=0,
        le=INT64_MAX,
        in_job=False,  # a job's seed is the request's top-level `seed`
    )

    @property
    def resolved_vocab_size(self) -> int:
        """The tokenizer's vocabulary (the "None = ..." rule of vocab_size lives here only)."""
        return 258 if self.tokenizer == "byte" else (self.vocab_size or 4096)


# L-BFGS's rate is the length of its line search's first step, not a gradient step's scale: AdamW's
# 1e-3 left it learning nothing in 40 steps (val loss 5.58, the byte vocabulary's ln 258), 1 (torch's
# default) reached 2.95
LBFGS_LEARNING_RATE = 1.0


def default_learning_rate(optimizer: str | None) -> float:
    """The learning rate a run gets when it gives none: AdamW's and Muon's, or L-BFGS's own."""
    if optimizer == "lbfgs":
        return LBFGS_LEARNING_RATE
    return float(OptimizerFields.model_fields["learning_rate"].default)


class OptimizerFields(StrictConfig):
    """The optimizer and its settings."""

    optimizer: Literal["adamw", "lbfgs", "muon"] = param(
        "adamw", "adamw, lbfgs or muon (Muon for the blocks' matrices, AdamW for the rest)", title="Optimizer"
    )
    learning_rate: float = param(
        1e-3,
        f"peak learning rate (lbfgs: {LBFGS_LEARNING_RATE:g} unless given: it scales the line search's first step)",
        title="Learning rate",
        gt=0,
        le=1e6,
        advanced=False,
    )
    weight_decay: float = param(
        0.1,
        "decoupled weight decay of the 2-D weights: each step shrinks them by the schedule's rate x "
        "this (muon: its matrices by the same factor, whatever muon_learning_rate)",
        title="Weight decay",
        ge=0,
        le=10,
    )
    # 0.8, not the usual 0.9: at the small batches this trains with, less momentum reaches a given
    # loss in fewer steps (bench/README.md, "time to quality")
    beta1: float = param(0.8, "AdamW beta1", title="Adam β1", ge=0, lt=1)
    beta2: float = param(0.95, "AdamW beta2", title="Adam β2", ge=0, lt=1)
    eps: float = param(1e-8, "AdamW epsilon", title="Adam ε", ge=0, le=1)
    embedding_lr_scale: float = param(
        10.0,
        "AdamW: the token embedding's learning rate as a multiple of the schedule's, without weight "
        "decay (untied embeddings only; 1 = like the other weights)",
        title="Embedding LR scale",
        gt=0,
        le=1000,
    )
    # another scale than AdamW's: Muon's step is an orthogonalized matrix, entries of RMS ~1/sqrt(n_embd);
    # 0.02 is the hidden weights' rate Muon's author recommends (github.com/KellerJordan/Muon)
    muon_learning_rate: float = param(
        0.02,
        "muon: peak learning rate of the attention and feed-forward matrices (the schedule scales "
        "it as it scales learning_rate, which the other weights keep)",
        title="Muon learning rate",
        gt=0,
        le=1e6,
    )
    muon_momentum: float = param(
        0.95, "muon: Nesterov momentum of the matrices' updates", title="Muon momentum", ge=0, lt=1
    )
    grad_clip: float = param(
        1.0, "clip the gradient norm to this (0 disables)", title="Gradient clip (0 = off)", ge=0, le=1e6
    )


class ScheduleFields(StrictConfig):
    """How long the run is and the learning rate over it."""

    # length of training: max_steps wins; n_epochs visits windows without replacement
    max_steps: Int | None = param(
        None,
        "optimizer steps",
        title="Max steps",
        ge=1,
        le=MAX_STEPS,
        null_means="1000 unless n_epochs is set",
        advanced=False,
    )
    n_epochs: Int | None = param(
        None,
        "passes over the training data, each window once a pass; sets the run's length, unless "
        "max_steps is given too: then max_steps ends the run, even mid-pass",
        title="Epochs",
        ge=1,
        le=10_000,
        null_means="off (max steps decide)",
        accepts_auto=True,
    )
    warmup_steps: Int | None = param(
        None,
        "linear warmup steps",
        title="Warmup steps",
        ge=0,
        le=MAX_STEPS,
        null_means="min(100, steps / 10)",
        advanced=False,
    )
    schedule: Literal["cosine", "cosine-restarts", "constant"] = param(
        "cosine", "learning-rate schedule after warmup", title="LR schedule", advanced=False
    )
    min_lr: float | None = param(
        None,
        "floor of the cosine schedule",
        title="Min learning rate",
        ge=0,
        le=1e6,
        null_means="learning rate / 10",
    )
    cos_decay_steps: Int | None = param(
        None,
        "cosine-restarts: length of the first cycle",
        title="Cosine cycle (steps)",
        ge=1,
        le=MAX_STEPS,
        null_means="total steps",
    )
    cos_decay_restart: float = param(
        1.1,
        "cosine-restarts: each cycle is this factor longer than the previous",
        title="Cycle growth",
        ge=1,
        le=100,
    )
    cos_decay_alpha: float = param(
        0.0,
        "cosine-restarts: floor as a fraction of the learning rate",
        title="Cosine floor (× LR)",
        ge=0,
        le=1,
    )

    def resolved_warmup(self, total_steps: int) -> int:
        return min(100, total_steps // 10) if self.warmup_steps is None else self.warmup_steps
