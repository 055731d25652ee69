"""The tile choice of the Triton kernels (trainer/model/kernel_tiles.py) with a fake clock: the
fastest candidate is kept per shape and timed once, untimed launches get the default, and a CPU
tensor is never timed. That every candidate computes the same values is checked by the kernels'
own cases (tests/trainer/triton_cases.py, each tile forced)."""

from __future__ import annotations

import pytest
import torch

from trainer.model.kernel_tiles import MIN_TIMED_ELEMENTS, Tile, TileTable, fastest, worth_timing

TILES = [Tile(1, 4), Tile(4, 4), Tile(16, 8), Tile(64, 8)]


class FakeClock:
    """Seconds per launch of each tile as given; counts what was timed."""

    def __init__(self, seconds: dict[int, float]):
        self.seconds, self.timed = seconds, []

    def __call__(self, launch: object, tile: Tile) -> float:
        self.timed.append(tile)
        return self.seconds[tile.rows]


def launch(tile: Tile) -> None:
    raise AssertionError("the fake clock never launches")


def table(clock: FakeClock) -> TileTable:
    t = TileTable("test", TILES, default=Tile(4, 4))
    t.seconds = clock
    return t


def test_fastest_takes_the_least_time_and_the_first_of_equals() -> None:
    times = {1: 3.0, 4: 1.0, 16: 1.0, 64: 2.0}
    best, measured = fastest(TILES, lambda tile: times[tile.rows])
    assert best == Tile(4, 4)
    assert measured == {tile: times[tile.rows] for tile in TILES}


def test_a_timed_launch_keeps_the_fastest_tile_for_its_shape_and_times_it_once() -> None:
    clock = FakeClock({1: 5e-4, 4: 3e-4, 16: 1e-4, 64: 2e-4})
    tiles = table(clock)
    assert tiles.choose("shape a", launch, timed=True) == Tile(16, 8)
    assert clock.timed == TILES
    assert tiles.times["shape a"][Tile(1, 4)] == 5e-4
    clock.seconds = {1: 1e-5, 4: 1e-3, 16: 1e-3, 64: 1e-3}  # the same shape is not timed again
    assert tiles.choose("shape a", launch, timed=True) == Tile(16, 8)
    assert tiles.choose("shape a", launch, timed=False) == Tile(16, 8)
    assert len(clock.timed) == len(TILES)
    assert tiles.choose("shape b", launch, timed=True) == Tile(1, 4)  # another shape is
    assert len(clock.timed) == 2 * len(TILES)


def test_an_untimed_launch_runs_the_default_and_remembers_nothing() -> None:
    clock = FakeClock({1: 5e-4, 4: 3e-4, 16: 1e-4, 64: 2e-4})
    tiles = table(clock)
    assert tiles.choose("shape", launch, timed=False) == Tile(4, 4)
    assert clock.timed == [] and tiles.chosen == {}
    assert tiles.choose("shape", launch, timed=True) == Tile(16, 8)


def test_only_the_tiles_that_fit_are_candidates() -> None:
    clock = FakeClock({1: 5e-4, 4: 3e-4, 16: 1e-4, 64: 2e-4})
    tiles = table(clock)
    fitting = tiles.fitting(max_elements=4096, block=1024)  # 4 rows of 1024 at most
    assert fitting == (Tile(1, 4), Tile(4, 4))
    assert tiles.choose("wide", launch, timed=True, candidates=fitting) == Tile(4, 4)
    assert clock.timed == [Tile(1, 4), Tile(4, 4)]
    assert tiles.fitting(max_elements=512, block=1024) == (Tile(1, 4),)  # none fits: the smallest


def test_a_forced_tile_wins_while_forced() -> None:
    clock = FakeClock({1: 5e-4, 4: 3e-4, 16: 1e-4, 64: 2e-4})
    tiles = table(clock)
    with tiles.forced(Tile(64, 8)):
        assert not tiles.will_time("shape", timed=True)
        assert tiles.choose("shape", launch, timed=True) == Tile(64, 8)
    assert clock.timed == []
    assert tiles.will_time("shape", timed=True) and not tiles.will_time("shape", timed=False)
    assert tiles.choose("shape", launch, timed=True) == Tile(16, 8)
    assert not tiles.will_time("shape", timed=True)  # chosen: never timed again


def test_only_big_training_launches_on_a_gpu_are_timed() -> None:
    cpu = torch.empty(1)
    assert not worth_timing(cpu, MIN_TIMED_ELEMENTS, training=True)  # no CUDA events on a CPU
    assert not worth_timing(cpu, MIN_TIMED_ELEMENTS, training=False)


class TooBig(Exception):
    pass


def test_a_candidate_this_gpu_cannot_build_is_skipped() -> None:
    def seconds(launch: object, tile: Tile) -> float:
        if tile.rows == 16:
            raise TooBig("out of shared memory")  # the fastest, were it buildable
        return {1: 5e-4, 4: 3e-4, 64: 4e-4}[tile.rows]

    tiles = TileTable("test", TILES, default=Tile(4, 4), unbuildable=(TooBig,))
    tiles.seconds = seconds
    assert tiles.choose("shape", launch, timed=True) == Tile(4, 4)
    assert tiles.times["shape"][Tile(16, 8)] == float("inf")
    strict = TileTable("test", TILES, default=Tile(4, 4))  # anything else still raises
    strict.seconds = seconds
    with pytest.raises(TooBig):
        strict.choose("shape", launch, timed=True)
