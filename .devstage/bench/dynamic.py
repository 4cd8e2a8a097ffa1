"""A package with run-time dims against a static package of the same model, at one shape, in one run.

Usage::

    python -m bench.dynamic [--batch 1] [--seq 128] [--repeat 10] [--warmup 2] [--out bench/results]

Compiles all-MiniLM-L6-v2 twice for ``--device-class cpu``: statically (``--dim batch=B --dim seq=S``) and with
run-time dims (``--dim batch=1..4 --dim seq=1..512@S``), checks both against onnxruntime, and prints median / min /
max milliseconds per run (after warm-up, the two packages' runs interleaved; first run separately) and the dynamic / static ratio; writes the same
as JSON (``dynamic-<date>.json``). The dynamic package reads its dims from a uniform, so index arithmetic divides
by run-time values instead of constants and some loops lose their constant trip counts.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, summary, time_runs, write_record

MODEL = ROOT.parent / "shared" / "models" / "all_minilm_l6_v2.onnx"


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    import onnxruntime as ort

    import kiln
    from tools.dynamic_minilm import feeds

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console()
    f = feeds(np.random.default_rng(0), args.batch, args.seq)
    want = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"]).run(["last_hidden_state"], f)[0]
    variants = {"static": {"batch": args.batch, "seq": args.seq},
                "dynamic": {"batch": (1, 4), "seq": (1, 512, args.seq)}}
    results, sessions, colds = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims in variants.items():
            with console.status(f"compiling the {name} package"):
                sessions[name] = kiln.load(kiln.compile(args.model, Path(tmp) / name, dims=dims, device_class="cpu"))
            colds[name], _ = time_runs(lambda s=sessions[name]: s.run(f), 0, args.warmup)
        # interleaved, so load from other processes on a shared machine hits both alike
        times: dict[str, list[float]] = {name: [] for name in variants}
        with console.status("timing (interleaved)"):
            for _ in range(args.repeat):
                for name, session in sessions.items():
                    times[name] += time_runs(lambda s=session: s.run(f), 1, 0)[1]
        for name, dims in variants.items():
            err = float(np.abs(sessions[name].run(f)["last_hidden_state"] - want).max())
            results[name] = {**summary(times[name], colds[name]), "max_abs_error": err,
                             "dims": {k: list(v) if isinstance(v, tuple) else v for k, v in dims.items()}}
    ratio = results["dynamic"]["median_ms"] / results["static"]["median_ms"]
    table = Table(title=f"MiniLM batch={args.batch} seq={args.seq}, native wgpu-py")
    for col in ("package", "median ms", "min ms", "max ms", "first ms", "max abs err vs onnxruntime"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['median_ms']:.1f}", f"{r['min_ms']:.1f}", f"{r['max_ms']:.1f}", f"{r['cold_ms']:.1f}",
                      f"{r['max_abs_error']:.1e}")
    console.print(table)
    console.print(f"dynamic / static: {ratio:.2f}x")
    from kiln.runtime import gpu

    record = {"benchmark": "dynamic", "model": args.model.name, "batch": args.batch, "seq": args.seq,
              "device": gpu.adapter().info.get("device", "?"), "results": results,
              "dynamic_over_static": ratio}
    path = write_record(record, args.out, "dynamic")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
