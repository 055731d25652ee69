"""How many rows one program of a Triton kernel takes (its tile), chosen by timing the candidates on
the GPU at hand, once per shape, rather than guessed on a machine without one.

The kernels of trainer/model/triton_kernels.py that move rows of activations (RoPE's head move,
RMSNorm both ways; the cross-entropy, whose tile is the columns of its row read at once) are bound
by memory traffic, and the bytes a program keeps in flight decide how close they come to the card's
bandwidth: one token's head per program left an H100 moving 0.4 TB/s of its ~3. The best tile
differs between GPUs, dtypes and widths, so a training run times each candidate on its first launch
of a shape (a few launches each; a machine's first run also builds each candidate, which Triton's
cache keeps: the worker keeps it in its data dir) and keeps the fastest for the rest of the process.

Timing is only done where it is safe and pays: a training launch (not decoding or evaluation) of
at least MIN_TIMED_ELEMENTS on a CUDA device, never while a CUDA graph is being captured, never
under Triton's interpreter. Everywhere else the table's default tile runs. Every candidate
computes the same values (each launch writes every output element; tests run each one), so the
choice changes speed only.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

import torch

MIN_TIMED_ELEMENTS = 1 << 20  # smaller launches are bound by the launch itself: any tile will do
TIMED_LAUNCHES = 5  # per candidate, after one untimed launch (which compiles it)

Launch = Callable[["Tile"], None]


@dataclass(frozen=True)
class Tile:
    rows: int  # rows (tokens) one program takes at a time; or the `unit` it takes
    warps: int
    unit: str = "rows"  # the cross-entropy's tile: "columns" (vocabulary entries) of its one row

    def __str__(self) -> str:
        return f"{self.rows} {self.unit} x {self.warps} warps"


def fastest(
    candidates: Sequence[Tile],
    seconds_of: Callable[[Tile], float],
    unbuildable: tuple[type[Exception], ...] = (),
) -> tuple[Tile, dict[Tile, float]]:
    """The candidate that took least time, and every candidate's time (the first of equals wins).
    A candidate whose kernel raises one of `unbuildable` (Triton's OutOfResources: more registers
    or shared memory than this GPU has) takes forever, so it is never chosen."""
    times = {}
    for tile in candidates:
        try:
            times[tile] = seconds_of(tile)
        except unbuildable:
            times[tile] = math.inf
    return min(candidates, key=lambda tile: times[tile]), times


def cuda_seconds(fn: Callable[[], object], calls: int = 1) -> float:
    """Seconds per call of fn on the current CUDA stream: `calls` calls captured as one CUDA graph,
    replayed between two events (the GPU's time, not the host's). Timed as launched, a small kernel
    measures the host: an H100 box's RMSNorm forward took 135 us a call through its wrapper and
    39 us launched bare, back to back. fn must have run once (compiled, loaded) before; where its
    calls cannot be captured, they are timed as launched."""
    graph = _captured(fn, calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    if graph is not None:
        graph.replay()
    else:
        for _ in range(calls):
            fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / calls


def _captured(fn: Callable[[], object], calls: int) -> torch.cuda.CUDAGraph | None:
    """`calls` calls of fn as one CUDA graph, or None where capturing fails. Captured on a stream of
    its own, thread-local (a checkpoint writer's thread may use CUDA meanwhile); torch.cuda.graph
    would also empty the allocator's caches, mid-step."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for _ in range(calls):
                    fn()
            finally:
                graph.capture_end()
    except RuntimeError:
        return None
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def seconds_on_device(launch: Launch, tile: Tile) -> float:
    """Seconds per launch of `tile`: one untimed launch, then the mean of TIMED_LAUNCHES."""
    launch(tile)
    return cuda_seconds(functools.partial(launch, tile), TIMED_LAUNCHES)


def worth_timing(t: torch.Tensor, elements: int, training: bool) -> bool:
    """Whether a launch over `elements` values of t may time its candidates (module docstring)."""
    from trainer.model.triton_kernels import interpreted

    return (
        training
        and t.is_cuda
        and elements >= MIN_TIMED_ELEMENTS
        and not interpreted()
        and not torch.cuda.is_current_stream_capturing()
    )


class TileTable:
    """One kernel's candidate tiles and, per shape key, the one timed fastest on this process's GPU."""

    def __init__(
        self,
        name: str,
        candidates: Sequence[Tile],
        default: Tile,
        unbuildable: tuple[type[Exception], ...] = (),
    ):
        assert default in candidates
        self.name, self.candidates, self.default = name, tuple(candidates), default
        self.unbuildable = unbuildable  # what a candidate too big for this GPU raises (`fastest`)
        self.chosen: dict[Hashable, Tile] = {}
        self.times: dict[Hashable, dict[Tile, float]] = {}
        self._forced: Tile | None = None
        self.seconds: Callable[[Launch, Tile], float] = seconds_on_device  # tests: a fake clock
        self._lock = threading.Lock()  # decoders and training may share a process

    def fitting(self, max_elements: int, block: int) -> tuple[Tile, ...]:
        """The candidates whose tile (rows x block values) keeps within max_elements (registers);
        where none does, the smallest."""
        fit = tuple(t for t in self.candidates if t.rows * block <= max_elements)
        return fit or (min(self.candidates, key=lambda t: (t.rows, t.warps)),)

    def known(self, key: Hashable) -> Tile | None:
        """The tile `choose` would give without timing anything: the forced one, or the one already
        chosen for `key` (None: ask `choose`). Asked first, so whether to time and what fits are
        worked out only on a shape's first launch (host time in every launch of a step)."""
        return self._forced or self.chosen.get(key)

    def pick(
        self,
        key: Hashable,
        launch: Launch,
        t: torch.Tensor,
        elements: int,
        training: bool,
        fit: tuple[int, int],
    ) -> Tile:
        """A wrapper's tile for a launch over `elements` values of t: the known one, else `choose`'s,
        timed where worth_timing says so, among the candidates fitting(*fit) (max_elements, block)."""
        return self.known(key) or self.choose(
            key, launch, worth_timing(t, elements, training), self.fitting(*fit)
        )

    def choose(self, key: Hashable, launch: Launch, timed: bool, candidates: Sequence[Tile] = ()) -> Tile:
        """The tile for this launch: the forced one (tests), the one timed fastest for `key` (timing
        the candidates now when `timed` and it is the key's first launch), or the default."""
        if self._forced is not None:
            return self._forced
        candidates = tuple(candidates) or self.candidates
        with self._lock:
            if (tile := self.chosen.get(key)) is not None:
                return tile
            if not timed:
                return self.default if self.default in candidates else candidates[0]
            seconds_of = functools.partial(self.seconds, launch)
            tile, self.times[key] = fastest(candidates, seconds_of, self.unbuildable)
            self.chosen[key] = tile
            return tile

    def will_time(self, key: Hashable, timed: bool) -> bool:
        """Whether `choose(key, ..., timed)` would time the candidates now: a kernel whose timed
        launches must write apart (one writing in place) allocates that output only then."""
        return timed and self._forced is None and key not in self.chosen

    @contextlib.contextmanager
    def forced(self, tile: Tile) -> Iterator[None]:
        """Every launch in the block runs `tile` (the tests check each candidate's numerics)."""
        self._forced = tile
        try:
            yield
        finally:
            self._forced = None
