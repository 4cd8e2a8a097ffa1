"""Wall-clock timing shared by the runtimes' ``benchmark`` and ``profile`` methods.

GPUs lower their clocks when idle and raise them only under sustained work: the lent H200 idles at 345 MHz and needs
0.75-1 s of back-to-back runs to reach 1980 MHz, and falls back within half a second of idling
(``bench/results/gpu-20261130-h200-session40.txt``). A count of warm-up runs (3 runs of 1 ms) measures that ramp, not
the kernels; ``warmup_s`` runs untimed calls until that many seconds have passed (:func:`clock_warmup_s` gives a
sensible default per adapter).
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: seconds of untimed back-to-back runs that bring a GPU's clocks up before timing (see the module docstring)
GPU_CLOCK_RAMP_S = 1.0


def warm(fn: Callable[[], object], warmup: int, warmup_s: float = 0.0) -> None:
    """Call ``fn`` ``warmup`` times, and more until ``warmup_s`` seconds have passed since the first call."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    while time.perf_counter() - start < warmup_s:
        fn()


def wall_clock_ms(fn: Callable[[], object], repeat: int, warmup: int, warmup_s: float = 0.0) -> list[float]:
    """Milliseconds of ``repeat`` calls of ``fn`` (each timed alone on ``time.perf_counter``) after ``warmup``
    untimed calls and at least ``warmup_s`` seconds of them (:func:`warm`)."""
    warm(fn, warmup, warmup_s)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def clock_warmup_s(adapter_info: dict) -> float:
    """The default ``warmup_s`` for a WebGPU adapter (wgpu's ``adapter.info``): :data:`GPU_CLOCK_RAMP_S` for a GPU,
    0 for a CPU adapter (Mesa's lavapipe, SwiftShader), whose clock the host's work already holds up."""
    return 0.0 if adapter_info.get("adapter_type") == "CPU" else GPU_CLOCK_RAMP_S
