"""A clock that moves only when a test moves it (`clock.now += seconds`): the arithmetic of code
that reads time (compile auto's payback, gpu_check's deadline, a benchmark's budget) checked without
waiting and without timing asserts."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
