"""Wall-clock timing shared by the runtimes' ``benchmark`` methods."""

from __future__ import annotations

import time
from collections.abc import Callable


def wall_clock_ms(fn: Callable[[], object], repeat: int, warmup: int) -> list[float]:
    """Milliseconds of ``repeat`` calls of ``fn`` (each timed alone on ``time.perf_counter``) after ``warmup``
    untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times
