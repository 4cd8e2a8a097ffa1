"""Where a decode step's time goes: GPU time per kernel (timestamp queries) against the step's wall clock.

Usage: ``python -m bench.llm_profile [--model M.gguf] [--context 1024] [--prompt 0] [--precision fp32]
[--device-class gpu]``; prints the step's dispatches, wall-clock ms, summed GPU ms and the kernels that take the
most GPU time. ``--prompt P`` profiles a prefill step of ``P`` tokens (an empty cache) instead of a decode step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.llm import MODEL


def main(argv: list[str] | None = None) -> None:
    """Profile one decode step and print the summary."""
    import kiln
    from kiln.compiler import compile_model

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=0, help="profile a prefill of this many tokens instead")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--device-class", default="gpu", choices=["gpu", "cpu"])
    a = ap.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="kiln-llm-")) / "pkg"
    compile_model(a.model, out, max_context=max(a.context, a.prompt) + 8, device_class=a.device_class, validate=False,
                  precision=a.precision)
    s = kiln.load(out)
    gen = s.manifest["generation"]
    if a.prompt:
        feeds = {gen["input_ids"]: np.full((1, a.prompt), 42, np.int64), gen["cache"]["position"]: np.array([0], np.int64)}
    else:  # one token after a.context - 1 cached ones (the cache, the package's state, stays in place)
        feeds = {gen["input_ids"]: np.array([[42]], np.int64),
                 gen["cache"]["position"]: np.array([a.context - 1], np.int64)}
    for _ in range(3):
        s.run(feeds)
    walls = []
    for _ in range(10):
        t0 = time.perf_counter()
        s.run(feeds)
        walls.append((time.perf_counter() - t0) * 1e3)
    prof = [p for p in s.profile(feeds, repeat=5) if p["dispatch"][0]]  # (steps with no workgroups this step: none)
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for p in prof:
        total[p["kernel"]] = total.get(p["kernel"], 0.0) + p["ms"]
        count[p["kernel"]] = count.get(p["kernel"], 0) + 1
    what = f"prefill of {a.prompt} tokens" if a.prompt else f"decode step at context {a.context}"
    print(f"{what} ({a.precision}): {len(prof)} dispatches, wall {np.median(walls):.2f} ms, "
          f"GPU {sum(total.values()):.2f} ms")
    for k, v in sorted(total.items(), key=lambda x: -x[1])[:12]:
        print(f"  {k:48s} x{count[k]:4d} {v:8.3f} ms")


if __name__ == "__main__":
    main()
