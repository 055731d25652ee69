"""The output projection and the cross-entropy in one autograd function that never holds the whole
(N, V) logits: the rows go through in chunks, and each chunk's gradients (with respect to the hidden
states and the weight) are computed in the forward pass, right after its loss, while its logits are
at hand. The backward pass only scales them by the incoming gradient. What stays alive between the
passes is one gradient the size of the hidden states and one the size of the weight, in place of
the float32 logits' log-softmax (and, in the backward, their gradient): at N = 16k rows and V = 32k
that is 2 x 2.1 GB fewer. trainer.config.fused_loss says where it is used (CUDA by default).

The values are the plain path's, F.cross_entropy(F.linear(h, w).float(), t): the matmuls run in
the compute dtype (the autocast dtype when autocast is on), the softmax in float32, the weight's
gradient is summed over the chunks in float32. On CUDA one Triton kernel per chunk
(trainer.model.triton_ops.cross_entropy_rows) takes the logits in the compute dtype and gives the
loss, the argmax and the gradient, written over the logits: two reads and a write of the chunk,
where the torch ops make about eight passes over float32 copies of it.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from trainer.config.fused_loss import CHUNK_BYTES, chunk_rows, fused_cross_entropy_on
from trainer.model.fused_ops import compute_dtype, triton_kernels_for


def fused_applies(hidden: torch.Tensor) -> bool:
    """Whether the loss over these hidden states runs fused: the device and dtype rule of
    trainer.config.fused_loss, and not while compiling (inductor gets the plain ops to fuse)."""
    if torch.compiler.is_compiling():
        return False
    dtype_name = str(compute_dtype(hidden)).removeprefix("torch.")
    return fused_cross_entropy_on(hidden.device.type, dtype_name)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    reduction: Literal["mean", "sum"] = "mean",
    *,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, argmax): the cross-entropy of logits = hidden @ weight.T (hidden (N, C), weight (V, C),
    targets (N,)) over the targets that are not ignore_index, their mean or sum, and each row's
    argmax over the vocabulary (N,) (for token accuracy; no gradient). A mean over no target is NaN,
    as F.cross_entropy's is."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    cdt = compute_dtype(hidden)
    rows = chunk_rows(hidden.shape[0], weight.shape[0], chunk_bytes)
    # grad mode is off inside forward, and needs_input_grad does not see a no_grad block: ask here
    grads = torch.is_grad_enabled()
    loss, argmax = _LinearCrossEntropy.apply(
        hidden, weight, targets, ignore_index, reduction == "mean", cdt, rows, grads
    )
    return loss, argmax


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        mean: bool,
        cdt: torch.dtype,
        rows: int,
        grads: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        need_h, need_w = grads and ctx.needs_input_grad[0], grads and ctx.needs_input_grad[1]
        # the dtypes are explicit below; autocast would cast the float32 softmax back down
        with torch.autocast(hidden.device.type, enabled=False):
            chunks = _Chunks(hidden, weight, targets, ignore_index, mean, cdt, need_h, need_w)
            for start in range(0, hidden.shape[0], rows):
                chunks.run(start, min(start + rows, hidden.shape[0]))
        ctx.mark_non_differentiable(chunks.argmax)
        grad_w = chunks.grad_weight.to(weight.dtype) if chunks.grad_weight is not None else None
        ctx.save_for_backward(chunks.grad_hidden, grad_w)
        return chunks.loss(), chunks.argmax

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_argmax: Any) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        # a 0-dim factor keeps the saved gradient's dtype (rounded once, computed in float32)
        return (
            grad_h * grad_loss if grad_h is not None else None,
            grad_w * grad_loss if grad_w is not None else None,
            None, None, None, None, None, None,
        )  # fmt: skip


class _Chunks:
    """The running sums of one forward: the loss, and the gradients of a loss with backward factor 1."""

    def __init__(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        mean: bool,
        cdt: torch.dtype,
        need_h: bool,
        need_w: bool,
    ):
        self.hidden, self.targets, self.cdt, self.ignore_index = hidden, targets, cdt, ignore_index
        self.weight = weight.to(cdt)  # cast once for every chunk, as autocast's cache would
        # CUDA: the Triton kernel of the loss (trainer.model.triton_ops), else torch ops
        self.kernels = triton_kernels_for(hidden, self.weight)
        self.valid = targets != ignore_index
        self.count = self.valid.sum()  # a tensor: no device sync
        # a mean's gradient factor: with no target counted every row's gradient is 0 (as F's is), so
        # any finite factor; the loss itself divides by the count and is NaN then, as F's is
        self.scale = self.count.clamp(min=1).float().reciprocal() if mean else None
        # the kernel's gradient factor, a device tensor: a mean's, or 1 for a sum
        self.kernel_scale: torch.Tensor | None = None
        if self.kernels is not None:
            one = torch.ones((), dtype=torch.float32, device=hidden.device)
            self.kernel_scale = self.scale if self.scale is not None else one
        self.total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        self.argmax = torch.empty(targets.shape, dtype=torch.long, device=hidden.device)
        self.grad_hidden = torch.empty_like(hidden) if need_h else None
        self.grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )

    def run(self, start: int, end: int) -> None:
        h = self.hidden[start:end].to(self.cdt)
        logits = h @ self.weight.t()  # (rows, V) in the compute dtype
        if self.kernels is not None:
            grad = self._kernel_rows(logits, start, end)
        else:
            grad = self._torch_rows(logits, start, end)
        if grad is None:
            return
        if self.grad_hidden is not None:
            out = self.grad_hidden[start:end]
            if out.dtype == grad.dtype:
                torch.mm(grad, self.weight, out=out)
            else:  # hidden in float32 under autocast: the gradient cast back, as autocast's is
                out.copy_(grad @ self.weight)
        if self.grad_weight is not None:
            if grad.dtype == torch.float32:
                self.grad_weight.addmm_(grad.t(), h)
            else:  # a half-precision product, summed in float32
                self.grad_weight += grad.t() @ h

    def _kernel_rows(self, logits: torch.Tensor, start: int, end: int) -> torch.Tensor | None:
        """Loss, argmax and the logits' gradient (over the logits, in place) in one Triton kernel."""
        assert self.kernels is not None and self.kernel_scale is not None
        wants_grad = self.grad_hidden is not None or self.grad_weight is not None
        targets, argmax = self.targets[start:end].contiguous(), self.argmax[start:end]
        grad = logits if wants_grad else None  # written over the logits
        terms = self.kernels.cross_entropy_rows(
            logits, targets, self.ignore_index, self.kernel_scale, argmax, grad
        )
        self.total += terms.sum()
        return grad

    def _torch_rows(self, logits: torch.Tensor, start: int, end: int) -> torch.Tensor | None:
        """The same in torch ops: the loss and argmax of the rows, and their logits' gradient (softmax
        - one-hot, scaled) in the compute dtype, or None when no gradient is wanted."""
        valid = self.valid[start:end]
        target = torch.where(valid, self.targets[start:end], 0).unsqueeze(1)  # ignored rows: any id
        logits = logits.float()
        self.argmax[start:end] = logits.argmax(dim=1)
        # one fused kernel (logsumexp then a subtraction would be several passes over the chunk)
        log_probs = torch.log_softmax(logits, dim=1)
        del logits
        terms = log_probs.gather(1, target).squeeze(1).neg_()
        self.total += torch.where(valid, terms, 0.0).sum()
        if self.grad_hidden is None and self.grad_weight is None:
            return None
        # d loss / d logits = softmax - one-hot, zero on ignored rows; computed in log_probs' buffer
        grad = log_probs.exp_()
        grad.scatter_add_(1, target, -valid.to(grad.dtype).unsqueeze(1))
        factor = valid.to(grad.dtype) if self.scale is None else valid.to(grad.dtype) * self.scale
        return grad.mul_(factor.unsqueeze(1)).to(self.cdt)

    def loss(self) -> torch.Tensor:
        return self.total / self.count if self.scale is not None else self.total
