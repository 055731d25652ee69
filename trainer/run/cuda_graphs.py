"""When a run replays its transformer blocks as CUDA graphs (TrainConfig.cuda_graphs;
trainer.model.graphed_blocks captures them).

At llama-110m's size an eager CUDA step waits on its host: on an H100 its kernels took 28 ms of a
54 ms step (bench/README.md), the rest being the host launching ~1,500 operations and ~100 Triton
kernels a step. torch.cuda.make_graphed_callables captures each block's forward and backward once;
a step then replays two graphs per block, and only the embedding, the loss and the optimizer
launch kernel by kernel.

The graphs hold where what they captured stays true: CUDA, one process, dropout 0 (the masks are
seeded per micro-batch, outside any graph), grad_accum 1 (a block's gradient buffers are rewritten
by its next replay), no activation checkpointing, torch.compile off for good (compile auto has
decided), and the step's batch shape. Evaluation, decoding and a batch of another shape run the
eager blocks. The capture runs between steps, after the first (whose launches time the Triton
tiles), and says so in the run's output. Before any step uses them, the first block's replay
(forward and backward) is checked against the eager block; a capture that fails, or whose replay
differs, leaves the run eager and says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.model.graphed_blocks import capture, difference_from_eager

if TYPE_CHECKING:
    from trainer.run.state import TrainRun

# a replay this far from the eager block (relative) is not the same computation: bf16 rounding
# of the same kernels is ~1e-3 at most
MAX_DIFFERENCE = 1e-2


def unusable(run: TrainRun) -> str | None:
    """Why the blocks cannot be graphed in this run (None: they can)."""
    cfg = run.cfg
    reasons = [
        (run.device.type != "cuda", "needs CUDA"),
        (run.world > 1, "one process only"),
        (cfg.resolved_dropout > 0, "needs dropout 0"),
        (cfg.grad_accum > 1, "needs grad_accum 1"),
        (cfg.activation_checkpointing, "not with activation checkpointing"),
        (bool(run.precision.get("compile")), "not with torch.compile"),
        (cfg.optimizer == "lbfgs", "not with L-BFGS (its line search re-runs the batch)"),
    ]
    return next((reason for applies, reason in reasons if applies), None)


def capture_when_due(run: TrainRun) -> str | None:
    """Captures the blocks once the run may (after its first step, compile auto done); returns the
    sentence for the run's output when it decided."""
    if not run.cfg.cuda_graphs or run.graphs_decided or run.step < 1:
        return None
    reason = unusable(run)
    if reason is None and run.compile_auto is not None:
        return None  # compile auto decides first: the graphs are of the eager blocks
    run.graphs_decided = True
    if reason is not None:
        return f"CUDA graphs off: {reason}"
    run.writer.wait()  # a capture fails if another thread calls CUDA meanwhile (a snapshot's copies)
    try:
        graphed = capture(run.model, run.cfg.batch_size, run.dtype)
        difference = difference_from_eager(run.model, graphed, run.dtype)
    except RuntimeError as e:  # torch's capture errors; the blocks are untouched: train eager
        first_line = (str(e).strip() or type(e).__name__).splitlines()[0]
        return f"CUDA graphs off: capturing the blocks failed ({first_line[:200]})"
    if not difference <= MAX_DIFFERENCE:  # NaN too
        return (
            f"CUDA graphs off: a captured block's replay differs from the eager block by {difference:.2e} "
            f"(relative; at most {MAX_DIFFERENCE:g} expected)"
        )
    run.model.graphed_blocks = graphed
    return (
        f"CUDA graphs on at step {run.step}: {run.model_cfg.n_layer} blocks captured, forward and "
        f"backward (a replay matches the eager block to {difference:.1e})"
    )
