"""Matrix products with few rows and a long reduction (MiniLM at batch 1, a prompt's prefill), under a sweep of schedules.

Run on the lent GPU machine (recipe: ../shared/gpu/README.md)::

    source bench/gpu_enter.sh; python3 -m bench.gemm_small --out $OUT

or here (lavapipe), small: ``python -m bench.gemm_small --shapes 32x256x64 --repeat 3 --no-torch``.

``C[M, N] = A[M, K] @ B[K, N]`` (fp32), MiniLM 1 x 128's products by default (``128x1536x384``: the FFN's second
product; ``128x384x1536``: its first; ``128x384x1152``: Q, K and V in one; ``128x384x384``: the attention's output). Kiln's rows:

- ``default``: the compiler's schedule (:func:`kiln.te.schedule.default_schedule`);
- ``lanes L tile RxC``: register tiles with ``L`` ``reduce_lanes`` sharing each tile's reduction;
- ``split-k S``: the reduction split in ``S`` parts (TVM's ``rfactor``): ``P[s, m, n] = sum_k A[m, s K/S + k]
  B[s K/S + k, n]`` under its default schedule, then ``C = sum_s P[s]``, two dispatches (their GPU times added).

Every output is checked against numpy (float64). GPU times from timestamp queries (medians of ``--repeat`` samples of
``--batch`` back-to-back dispatches); PyTorch strict fp32 (TF32 off) is the peer. Prints a table and writes JSON
(``gemm-small-<date>.json``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record
from kiln.arith.expr import reduce, reduce_axis
from kiln.codegen.webgpu import wgsl
from kiln.kernels import library
from kiln.runtime.kernel import KernelRunner
from kiln.te.compute import compute, inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import SHARED_MEDIUM, Schedule, SharedTiles, Split, default_schedule

#: the partial products' schedules tried: the default, shared operand tiles (:mod:`kiln.te.tiles`, as
#: :class:`~kiln.te.schedule.SharedTiles`: rows x columns a register tile, workgroup size, ``shared_k``, column group,
#: prefetch), register tiles alone. The prefetched 32-invocation blocks are what ``kiln tune`` chose for MiniLM 1 x 128's
#: products on an H200 (bench/results/tuning-h200.json)
PARTIAL = {"default": None,
           "shared 4x4 wg256 k16": SharedTiles(4, 4, 256, 16, 1, False),
           "shared 4x4 wg64 k16": SharedTiles(4, 4, 64, 16, 1, False),
           "shared 4x4 wg64 k8": SharedTiles(4, 4, 64, 8, 1, False),
           "shared 4x4 wg64 k32": SharedTiles(4, 4, 64, 32, 1, False),
           "shared 4x4 wg64 k16 prefetch": SharedTiles(4, 4, 64, 16, 1, True),
           "shared 4x4c wg64 k16 prefetch": SharedTiles(4, 4, 64, 16, 4, True),
           "shared 4x4c wg32 k16 prefetch": SharedTiles(4, 4, 32, 16, 4, True),
           "shared 4x4c wg32 k8 prefetch": SharedTiles(4, 4, 32, 8, 4, True),
           "shared 4x4c wg32 k32 prefetch": SharedTiles(4, 4, 32, 32, 4, True),
           "shared 8x2c wg32 k16 prefetch": SharedTiles(8, 2, 32, 16, 2, True),
           "shared 8x4c wg32 k16 prefetch": SharedTiles(8, 4, 32, 16, 4, True),
           "shared 4x4c wg128 k16 prefetch": SharedTiles(4, 4, 128, 16, 4, True),
           "shared 8x4 wg128 k16 prefetch (medium)": SHARED_MEDIUM,
           "tile 4x4 unroll8": "tile"}


def _schedule(spec, rank: int) -> Schedule | None:
    """``PARTIAL``'s entry as a :class:`Schedule` of a product whose last two output axes are its rows and columns."""
    if spec is None:
        return None
    if spec == "tile":
        return Schedule(workgroup_size=64, splits=(Split(rank - 2, 4, True), Split(rank - 1, 4)), unroll=8)
    return spec.schedule(rank - 2, rank - 1)


SHAPES = ("128x1536x384", "128x384x1536", "128x384x1152", "128x384x384")


def _time(t, sched: Schedule | None, inputs: list[np.ndarray], out_elements: int, args) -> tuple[float, np.ndarray, dict]:
    k = lower(t, sched or default_schedule(t))
    runner = KernelRunner(wgsl.render(k), inputs, out_elements, k.dispatch)
    out = runner.run()
    samples = runner.gpu_time(args.repeat, args.batch) or runner.time(args.repeat, args.batch)
    return statistics.median(samples), out, {"schedule": k.schedule.to_json(), "dispatch": list(k.dispatch)}


def split_k(m: int, kd: int, n: int, parts: int):
    """The partial products ``P[s, m, n]`` (reading ``A [m, kd]`` and ``B [kd, n]``) and their sum ``C [m, n]``."""
    a, b = placeholder((m, kd), name="a"), placeholder((kd, n), name="b")
    ks = kd // parts
    r = reduce_axis(ks, "rk")
    p = compute((parts, m, n), lambda s, i, j: reduce("sum", a[i, s * ks + r] * b[s * ks + r, j], [r]), "partial")
    partial = placeholder((parts, m, n), name="p")
    rs = reduce_axis(parts, "rs")
    return p, compute((m, n), lambda i, j: reduce("sum", partial[rs, i, j], [rs]), "sum")


def kiln_rows(m: int, kd: int, n: int, args) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, kd)).astype(np.float32)
    b = rng.standard_normal((kd, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(ref).max()
    t = inline(library.build("MatMul", [placeholder((m, kd)), placeholder((kd, n))], {}, (m, n), "matmul"))
    rows = {}

    def record(name, ms, out, info):
        err = float(np.abs(out.reshape(m, n) - ref).max() / scale)
        rows[name] = {"median_ms": ms, "tflops": 2 * m * kd * n / ms / 1e9, "max_rel_error": err, **info}

    for label, spec in PARTIAL.items():
        record(label, *_time(t, _schedule(spec, 2), [a, b], m * n, args))
    for lanes in (4, 8, 16, 32):
        for ti, tj in ((1, 1), (1, 4), (2, 4), (4, 4)):
            splits = tuple(s for s in (Split(0, ti, True), Split(1, tj)) if s.factor > 1)
            for wg in (64, 256):
                sched = Schedule(workgroup_size=wg, splits=splits, unroll=4, reduce_lanes=lanes)
                record(f"lanes {lanes} tile {ti}x{tj} wg{wg}", *_time(t, sched, [a, b], m * n, args))
    for parts in (2, 4, 8, 16):
        if kd % parts or kd // parts < 32:
            continue
        p, c = split_k(m, kd, n, parts)
        for label, spec in PARTIAL.items():
            pm, pout, pinfo = _time(p, _schedule(spec, 3), [a, b], parts * m * n, args)
            cm, out, cinfo = _time(c, None, [pout.reshape(parts, m, n)], m * n, args)
            record(f"split-k {parts} {label}", pm + cm, out,
                   {"partial_ms": pm, "sum_ms": cm, "partial": pinfo, "sum": cinfo})
    return rows


def torch_ms(m: int, kd: int, n: int, args) -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(m, kd, device="cuda"), torch.randn(kd, n, device="cuda")
    samples = []
    for i in range(3 + args.repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.batch):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            samples.append(start.elapsed_time(end) / args.batch)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> dict:
    """Run the sweep; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="MxKxN products, comma-separated")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--batch", type=int, default=20, help="dispatches per timed sample")
    ap.add_argument("--top", type=int, default=16, help="rows of each table (the fastest)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console(width=150)
    shapes = []
    for s in args.shapes.split(","):
        try:
            m, kd, n = (int(x) for x in s.split("x"))
        except ValueError:
            ap.error(f"--shapes takes MxKxN products, not {s!r}")
        shapes.append((m, kd, n))
    record = {"benchmark": "gemm-small", "repeat": args.repeat, "batch": args.batch, "shapes": {}}
    for m, kd, n in shapes:
        name = f"{m}x{kd}x{n}"
        entry = record["shapes"][name] = {"kiln": kiln_rows(m, kd, n, args)}
        if not args.no_torch:
            entry["torch_ms"] = torch_ms(m, kd, n, args)
        table = Table(title=f"C[{m}, {n}] = A[{m}, {kd}] @ B[{kd}, {n}] fp32, GPU ms (median of {args.repeat})")
        for col in ("schedule", "ms", "TFLOP/s", "torch / kiln", "max rel error", "dispatch"):
            table.add_column(col)
        peer = entry.get("torch_ms")
        ok = {r: v for r, v in entry["kiln"].items() if "median_ms" in v}
        for r, v in sorted(ok.items(), key=lambda kv: kv[1]["median_ms"])[:args.top]:
            table.add_row(r, f"{v['median_ms']:.4f}", f"{v['tflops']:.2f}",
                          f"{peer / v['median_ms']:.2f}" if peer else "", f"{v['max_rel_error']:.1e}",
                          str(v.get("dispatch", v.get("partial", {}).get("dispatch"))))
        if peer:
            table.add_row("torch", f"{peer:.4f}", f"{2 * m * kd * n / peer / 1e9:.2f}", "", "", "")
        console.print(table)
    path = write_record(record, args.out, "gemm-small")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
