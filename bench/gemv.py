"""A decode step's 4-bit matrix-vector products under a sweep of schedules, and the per-dispatch floor.

Run on the lent GPU machine (recipe: ../shared/gpu/README.md)::

    source bench/gpu_enter.sh; python3 -m bench.gemv --out $OUT

or here (lavapipe), small: ``python -m bench.gemv --shapes 576x960 --batch 5 --repeat 3``.

- ``gemv KxN``: ``y[1, N] = x[1, K] @ W[N, K]^T`` with ``W`` in 4-bit blocks of 32 with an f16 scale and minimum
  (GGUF's Q4_1, the ``MatMulNBits`` expression of :func:`kiln.kernels.quant.matmul_nbits`), SmolLM2-135M's shapes by
  default (576x960 Q/K/V, 576x3072 gate/up, 576x576 attention output, 1536x576 down); ``rmsKxN``: the product of
  RMSNorm's output, the norm's sum of squares computed in the same kernel. Each schedule's output is
  checked against numpy (float64 over the dequantized weights). GB/s counts the packed weights and scales read.
- ``floor``: a kernel of one workgroup that adds 1 to one element: what a dispatch costs with nothing to do.

Times are medians of ``--repeat`` samples, each ``--batch`` back-to-back dispatches of one kernel in one compute pass
(each writes the same output, so each waits for the one before, as a decode step's kernels do) divided by the
batch: GPU time from timestamp queries at the pass's start and end where the device has them (``median_ms``), and
the wall clock of encoding, submitting and waiting (``wall_ms``). Prints a table and writes JSON (``gemv-<date>.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record
from kiln.arith.expr import call, hoist_factors, reduce, reduce_axis
from kiln.codegen.webgpu import wgsl
from kiln.kernels import quant
from kiln.runtime.kernel import KernelRunner
from kiln.te.compute import compute, inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, default_schedule

SHAPES = "576x960,576x3072,576x576,1536x576,rms576x960,rms576x3072"


def q4_weights(k: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random Q4_1-style weights: ``(packed [n, k/8] int32, scales [n, k/32] int32 of f16 scale | f16 min << 16,
    dequantized [n, k] float64)``."""
    q = rng.integers(0, 16, (n, k)).astype(np.uint32)
    packed = np.zeros((n, k // 8), np.uint32)
    for f in range(8):
        packed |= q[:, f::8] << (4 * f)
    scale = (rng.random((n, k // 32)) * 0.02 + 0.001).astype(np.float16)
    low = (-rng.random((n, k // 32)) * 0.1).astype(np.float16)
    words = scale.view(np.uint16).astype(np.uint32) | (low.view(np.uint16).astype(np.uint32) << 16)
    w = q.astype(np.float64) * np.repeat(scale.astype(np.float64), 32, 1) + np.repeat(low.astype(np.float64), 32, 1)
    return packed.view(np.int32), words.view(np.int32), w


def schedules(t) -> dict[str, Schedule]:
    """The default schedule and reduce lanes x workgroup sizes x unrolling."""
    out = {"default": default_schedule(t)}
    for wg in (64, 128, 256):
        for lanes in (8, 16, 32, 64, 128, 256):
            if lanes <= wg:
                for unroll in (1, 8):
                    out[f"wg{wg} lanes{lanes} unroll{unroll}"] = Schedule(workgroup_size=wg, reduce_lanes=lanes,
                                                                          unroll=unroll)
    return out


def gemv(k: int, n: int, args, console: Console, norm: bool = False) -> dict:
    """Every schedule of the sweep on one K x N product; ``norm``: of ``RMSNorm(x) * gamma`` (eps 1e-5), the norm's
    reduction inside the product's kernel as Kiln fuses a decode step's (``fuse_norm_prologues``)."""
    rng = np.random.default_rng(0)
    packed, scales, w = q4_weights(k, n, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    gamma = rng.standard_normal(k).astype(np.float32)
    attrs = {"bits": 4, "block_size": 32, "K": k, "N": n, "scale_format": "f16x2"}
    a = xp = placeholder((1, k))
    inputs = [x]
    if norm:
        gp = placeholder((k,))
        rk = reduce_axis(k, "rk")
        sq = compute((1,), lambda i: reduce("sum", xp[i, rk] * xp[i, rk], [rk]), "sq")
        a = compute((1, k), lambda i, j: xp[i, j] / call("sqrt", sq[i] / float(k) + 1e-5) * gp[j], "norm")
        inputs = [x, gamma]
    t = inline(quant.matmul_nbits(a, placeholder((n, k // 8), "int32"), placeholder((n, k // 32), "int32"), None,
                                  attrs, (1, n), "gemv"))
    t = dataclasses.replace(t, body=hoist_factors(t.body))  # (as kiln.codegen.lowering.group_expr does)
    xr = x.astype(np.float64)
    if norm:
        xr = xr / np.sqrt((xr ** 2).mean() + 1e-5) * gamma
    ref = xr @ w.T
    nbytes = packed.nbytes + scales.nbytes
    rows = {}
    for name, sched in schedules(t).items():
        kern = lower(t, sched)
        runner = KernelRunner(wgsl.render(kern), [*inputs, packed, scales], n, kern.dispatch)
        err = float(np.abs(runner.run() - ref.reshape(-1)).max() / np.abs(ref).max())
        wall, ms = timed(runner, args)
        rows[name] = {"schedule": kern.schedule.to_json(), "dispatch": list(kern.dispatch), "median_ms": ms,
                      "wall_ms": wall, "gb_per_s": nbytes / ms / 1e6, "max_rel_error": err}
        del runner
    ok = {r: v for r, v in rows.items() if v["max_rel_error"] < 1e-4}
    best = min(ok or rows, key=lambda r: rows[r]["median_ms"])
    return {"best": best, "bytes": nbytes, "schedules": rows}


def timed(runner: KernelRunner, args) -> tuple[float, float]:
    """``(wall ms, GPU ms)`` per dispatch, medians (the GPU's from timestamp queries; the wall's where there are
    none)."""
    wall = statistics.median(runner.time(args.repeat, args.batch))
    gpu = runner.gpu_time(args.repeat, args.batch)
    return wall, statistics.median(gpu) if gpu else wall


def floor(args) -> dict:
    """The per-dispatch cost of a kernel with nothing to do (one workgroup adding 1 to one element)."""
    x = placeholder((1,))
    t = compute(x.shape, lambda i: x[i] + 1.0, "floor")
    kern = lower(t, Schedule())
    runner = KernelRunner(wgsl.render(kern), [np.zeros(1, np.float32)], 1, kern.dispatch)
    wall, ms = timed(runner, args)
    return {"median_ms": ms, "wall_ms": wall}


def main(argv: list[str] | None = None) -> dict:
    """Run the sweep; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help="KxN,... (default: SmolLM2-135M's)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--batch", type=int, default=200, help="dispatches per timed submit")
    ap.add_argument("--top", type=int, default=6, help="schedules shown per shape")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console(width=140)
    from kiln.runtime.kernel import device

    info = device().adapter.info
    shapes = [(s.startswith("rms"), *(int(v) for v in s.removeprefix("rms").split("x"))) for s in args.shapes.split(",")]
    record = {"benchmark": "gemv", "repeat": args.repeat, "batch": args.batch,
              "adapter": {k: info.get(k) for k in ("vendor", "device", "backend_type")},
              "floor": floor(args), "gemv": {f"{'rms' * norm}{k}x{n}": gemv(k, n, args, console, norm) for norm, k, n in shapes}}
    table = Table(title=f"Q4_1 matrix-vector products, median of {args.repeat} x {args.batch} dispatches")
    for col in ("K x N", "schedule", "workgroups", "GPU us", "wall us", "GB/s", "max rel error"):
        table.add_column(col)
    fl = record["floor"]
    table.add_row("floor", "1 workgroup, nothing to do", "1", f"{fl['median_ms'] * 1e3:.2f}", f"{fl['wall_ms'] * 1e3:.2f}",
                  "", "")
    for shape, r in record["gemv"].items():
        ranked = sorted(r["schedules"].items(), key=lambda kv: kv[1]["median_ms"])
        shown = ranked[:args.top] + [kv for kv in ranked[args.top:] if kv[0] == "default"]
        for name, s in shown:
            table.add_row(shape, name, str(s["dispatch"][0] * s["dispatch"][1]), f"{s['median_ms'] * 1e3:.2f}",
                          f"{s['wall_ms'] * 1e3:.2f}", f"{s['gb_per_s']:.0f}", f"{s['max_rel_error']:.1e}")
    console.print(table)
    path = write_record(record, args.out, "gemv")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
