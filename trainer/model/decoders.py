"""Decoding state for trainer.sampling: a prefill of the prompt, then one token per step.

On the CPU (and wherever graphs are off) each prefill builds a fresh KV cache sized to the context
and each step runs the model eagerly, as before. On CUDA one decoding step of a small model is
hundreds of tiny kernels whose launches, not their work, set the pace (issue 23 measured 1.2x the
CPU's tokens/s for llama-110m). There a GraphedDecoder captures the step once as a CUDA graph over a
KV cache at fixed addresses, with the token and its position in device tensors, and replays it:
one launch per token. Decoders are pooled per model, so concurrent requests for one model share its
weights (and its projections concatenated once, PackedWeights, where the training forward
concatenates them per call) and each reuses a captured graph instead of capturing its own.

FROMSCRATCH_CUDA_GRAPHS=0 turns graphed decoding off (A/B runs, debugging).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from trainer.model.kv_cache import KVCache
from trainer.model.llama import Llama
from trainer.model.packed_weights import PackedWeights


class Decoder(Protocol):
    # Whether step() only queues its work (a CUDA graph), so that a caller gains by handing it the
    # next token as a device tensor before reading that token back (trainer.sampling.decode).
    queues_ahead: bool

    @property
    def model(self) -> Llama: ...

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Starts over from `ids` (at most ctx of them); the logits (vocab,) after the last one."""
        ...

    def step(self, token: int | torch.Tensor) -> torch.Tensor:
        """Feeds one token (an id, or a one-element tensor holding it); the logits (vocab,) after it."""
        ...

    @property
    def position(self) -> int:
        """How many positions of the context are filled."""
        ...


class EagerDecoder:
    """A fresh KV cache per prefill, the model run eagerly: the CPU's path."""

    queues_ahead = False

    def __init__(self, model: Llama) -> None:
        self.model = model
        self.cache: KVCache | None = None

    @property
    def position(self) -> int:
        return self.cache.pos if self.cache is not None else 0

    def prefill(self, ids: list[int]) -> torch.Tensor:
        param = next(self.model.parameters())
        self.cache = KVCache(self.model.cfg, 1, param.device, param.dtype)
        return last_logits(self.model, ids, self.cache)

    def step(self, token: int | torch.Tensor) -> torch.Tensor:
        return last_logits(self.model, [int(token)], self.cache)


def last_logits(model: Llama, ids: list[int], cache: KVCache | None) -> torch.Tensor:
    """The logits (vocab,) after feeding `ids` through the model eagerly, advancing `cache`."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids], dtype=torch.long, device=device), cache=cache)
    return logits[0, -1]


class GraphedDecoder:
    """One request's decoding state with its step captured as a CUDA graph (`capture=False` runs the
    same step eagerly, which is how the CPU tests check its arithmetic). The graph reads the weights
    where they are, so it stays valid while the model is updated in place (`packed` copied again:
    PackedWeights.refresh), not if it is moved. It holds the model weakly: a pool's idle decoders
    must not keep a model alive (and on the GPU) after the worker's model cache has let it go."""

    queues_ahead = True

    def __init__(self, model: Llama, capture: bool, packed: PackedWeights | None = None) -> None:
        param = next(model.parameters())
        self._model = weakref.ref(model)
        self.cache = KVCache(model.cfg, 1, param.device, param.dtype)
        self.cache.packed = packed if packed is not None else PackedWeights(model)
        self.token = torch.zeros((1, 1), dtype=torch.long, device=param.device)
        self.device_position = torch.zeros(1, dtype=torch.long, device=param.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits = torch.empty(0)
        if capture:
            self._capture()

    @property
    def model(self) -> Llama:
        model = self._model()
        if model is None:  # only a caller that dropped the model and kept its decoder gets here
            raise RuntimeError("the decoder's model is gone")
        return model

    @property
    def position(self) -> int:
        return self.cache.pos

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """The prompt runs eagerly (its length varies) into the same buffers the graph reads; keys
        left from an earlier, longer context lie past the position and stay masked."""
        self.cache.pos, self.cache.position = 0, None
        return last_logits(self.model, ids, self.cache)

    def step(self, token: int | torch.Tensor) -> torch.Tensor:
        if self.cache.pos >= self.model.cfg.ctx:
            raise ValueError(f"the context of {self.model.cfg.ctx} tokens is full: prefill again")
        if isinstance(token, torch.Tensor):
            self.token.copy_(token.view(1, 1))  # on the device: nothing waits for its value
        else:
            self.token.fill_(token)
        self.device_position.fill_(self.cache.pos)
        if self.graph is not None:
            self.graph.replay()
            self.cache.pos += 1
            return self.logits
        return self._eager_step()

    def _eager_step(self) -> torch.Tensor:
        self.cache.position = self.device_position
        try:
            with torch.no_grad():
                logits, _ = self.model(self.token, cache=self.cache)
        finally:
            self.cache.position = None
        return logits[0, -1]

    def _capture(self) -> None:
        # Warm-up on a side stream (kernels chosen, Triton compiled), as CUDA graph capture asks;
        # the writes land at position 0, which the next prefill overwrites.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.cache.pos = 0
                self._eager_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads may keep decoding on this device while this one captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.cache.pos = 0
            self.logits = self._eager_step()
        self.graph, self.cache.pos = graph, 0


def graphs_enabled(model: Llama) -> bool:
    """Graphed decoding for a CUDA model in eval mode outside autocast (a graph keeps the autocast
    state it was captured under, and would replay one dropout mask), unless FROMSCRATCH_CUDA_GRAPHS=0."""
    param = next(model.parameters())
    if os.environ.get("FROMSCRATCH_CUDA_GRAPHS", "1") == "0" or param.device.type != "cuda":
        return False
    return not model.training and not torch.is_autocast_enabled("cuda")


def weight_layout(model: Llama) -> tuple[tuple[int, torch.dtype], ...]:
    """Where and in what dtype the model's tensors lie: a captured graph reads them there, so a
    model moved, cast or given new tensors since its decoders were made needs new ones."""
    return tuple((t.data_ptr(), t.dtype) for t in (*model.parameters(), *model.buffers()))


@dataclass
class _ModelDecoders:
    layout: tuple[tuple[int, torch.dtype], ...]
    packed: PackedWeights
    idle: list[GraphedDecoder] = field(default_factory=list)
    busy: int = 0  # decoders handed out and not yet back


class DecoderPool:
    """Idle GraphedDecoders per model, sharing its packed weights; a request takes one (or makes
    one) and gives it back. Keyed weakly: a model nobody else holds leaves with its decoders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: weakref.WeakKeyDictionary[Llama, _ModelDecoders] = weakref.WeakKeyDictionary()

    @contextmanager
    def take(self, model: Llama, capture: bool = True) -> Iterator[GraphedDecoder]:
        layout = weight_layout(model)
        with self._lock:
            entry = self._models.get(model)
            if entry is None or entry.layout != layout:  # new, or its buffers are stale
                entry = self._models[model] = _ModelDecoders(layout, PackedWeights(model))
            elif entry.busy == 0:
                # The weights may have changed since the last request (sampling between training
                # steps); while another request decodes they cannot have (eval mode, no training).
                # Queued on the stream after the graphs already launched, so none reads a half copy.
                entry.packed.refresh(model)
            entry.busy += 1
            decoder = entry.idle.pop() if entry.idle else None
        try:
            if decoder is None:
                decoder = GraphedDecoder(model, capture, entry.packed)
            yield decoder
        finally:
            with self._lock:
                entry.busy -= 1
                if decoder is not None and self._models.get(model) is entry:
                    entry.idle.append(decoder)

    def idle_count(self, model: Llama) -> int:
        with self._lock:
            entry = self._models.get(model)
            return len(entry.idle) if entry is not None else 0


POOL = DecoderPool()


@contextmanager
def decoder_for(model: Llama) -> Iterator[Decoder]:
    """The decoder for one request: graphed and pooled on CUDA, eager elsewhere."""
    if not graphs_enabled(model):
        yield EagerDecoder(model)
        return
    with POOL.take(model) as decoder:
        yield decoder
