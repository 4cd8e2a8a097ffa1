"""Timing and reporting helpers shared by the benchmarks."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kiln.runtime.timing import GPU_CLOCK_RAMP_S, warm

ROOT = Path(__file__).resolve().parents[1]


#: seconds of back-to-back runs before a GPU benchmark times anything: the runtime's clock ramp
#: (:data:`kiln.runtime.timing.GPU_CLOCK_RAMP_S`, whose module says why) with a margin
GPU_WARMUP_S = 1.5 * GPU_CLOCK_RAMP_S


def time_runs(fn: Callable[[], object], repeat: int, warmup: int, on_step: Callable[[], None] | None = None,
              sync: Callable[[], None] | None = None, warmup_s: float = 0.0) -> tuple[float, list[float]]:
    """Time ``fn``: returns (first call ms, ``repeat`` per-call ms after ``warmup`` more calls, and more until
    ``warmup_s`` seconds of them: :data:`GPU_WARMUP_S` for GPU work; :func:`kiln.runtime.timing.warm`).

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called before reading each clock, so
    asynchronous work is counted where it happens.
    """
    def one() -> float:
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        if on_step:
            on_step()
        return (time.perf_counter() - t0) * 1e3

    cold = one()
    warm(one, warmup, warmup_s)
    return cold, [one() for _ in range(repeat)]


def sm_clock_mhz() -> int | None:
    """The NVIDIA GPU's current SM clock (MHz, ``nvidia-smi --query-gpu=clocks.sm``; the first GPU), or None where
    there is no ``nvidia-smi``. Benchmarks record it right after their timed runs (:data:`GPU_WARMUP_S`)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=True)
        return int(done.stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def host_ms(session, feeds: dict, n: int) -> float:
    """Median ms until ``session.run(feeds, output="gpu")`` returns (the feeds written, the plan encoded and
    submitted; no waiting for the GPU), the device idle before each run: the host's share of a run. (``time_runs``
    would time the sync too.)"""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        session.run(feeds, output="gpu")
        times.append((time.perf_counter() - t0) * 1e3)
        session.sync()
    return float(np.median(times))


def summary(times: list[float], cold: float) -> dict[str, float]:
    """Median, min, max and first-run milliseconds."""
    return {"median_ms": float(np.median(times)), "min_ms": float(min(times)), "max_ms": float(max(times)),
            "cold_ms": float(cold)}


def commit() -> str:
    """Short git commit of the working tree: ``$KILN_COMMIT`` if set (the GPU machine gets no .git), else git's."""
    if os.environ.get("KILN_COMMIT"):
        return os.environ["KILN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_record(record: dict, out_dir: Path, stem: str) -> Path:
    """Write ``record`` (plus date, host, commit) as JSON ``<stem>-<UTC timestamp>.json`` in ``out_dir``."""
    now = datetime.datetime.now(datetime.UTC)
    record = {"date": now.isoformat(timespec="seconds"), "commit": commit(), "host": platform.node(), **record}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}-{now:%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(record, indent=1))
    return path
