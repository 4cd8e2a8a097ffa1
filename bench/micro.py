"""Micro-benchmarks against the roofline: a 4096^3 fp32 matmul and a copy, Kiln kernels vs PyTorch CUDA.

Run on the lent GPU machine (recipe: ../shared/gpu/README.md)::

    source bench/gpu_enter.sh; KILN_COMMIT=<sha> python3 -m bench.micro --out $OUT

or here (lavapipe) with a small size: ``python -m bench.micro --size 256 --no-torch``.
``--mkn M,K,N`` times a non-square product instead (MiniLM batch 32: ``4096,384,384`` and ``4096,384,1536``).

- ``matmul``: ``C = A @ B`` on N x N fp32 matrices. Kiln's kernel is the MatMul tensor expression
  lowered under each schedule of a small sweep (the default schedule first; register tiles, then
  shared operand tiles ``shared RxC wgW kK`` with rows and columns contiguous (``c``), strided (``s``) or, for
  columns, strided groups of 4 (``g``: the default products' layout), vector width ``vecV``, ``pf``: next chunk
  prefetched into registers); TFLOP/s = 2 M K N / time.
  PyTorch runs strict fp32 (TF32 off) on the same GPU.
- ``copy``: a 256 MiB fp32 copy (an identity elementwise kernel); GB/s counts bytes read plus
  written. PyTorch's ``copy_`` is the peer.

Times are medians of ``--repeat`` samples, each ``--batch`` back-to-back dispatches in one
submit divided by the batch (so launch overhead is amortised), after warm-up. Every Kiln
schedule's output is checked against numpy (``max_rel_error``; the best is the fastest within 1e-4).
Prints a table and writes JSON (``micro-<date>.json``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from bench.common import ROOT, write_record
from kiln.codegen.webgpu import wgsl
from kiln.kernels import library
from kiln.runtime.kernel import KernelRunner
from kiln.te.compute import compute, inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, Split, default_schedule

#: shared-tile candidates: (rows x cols register tile, workgroup size, shared_k, rows contiguous,
#: columns contiguous, vector width, prefetch, column group: strided groups of 4 columns, ``g``)
SHARED = ((8, 8, 256, 8, True, False, 1, False, 1), (8, 8, 256, 8, True, False, 4, False, 1),
          (8, 8, 256, 8, True, False, 4, True, 1), (8, 8, 256, 8, True, True, 4, False, 1),
          (8, 8, 256, 8, True, True, 4, True, 1), (8, 8, 256, 4, True, False, 4, False, 1),
          (8, 8, 256, 8, False, False, 1, False, 1), (4, 4, 256, 16, True, False, 4, False, 1),
          (4, 4, 256, 16, True, True, 4, False, 1), (4, 4, 256, 16, True, True, 4, True, 1),
          (4, 4, 256, 8, True, False, 1, False, 1), (8, 4, 128, 8, True, False, 4, False, 1),
          (4, 8, 128, 8, True, True, 4, False, 1), (8, 8, 64, 16, True, True, 4, False, 1),
          (8, 8, 64, 16, True, True, 4, True, 1), (4, 4, 64, 16, True, False, 4, False, 1),
          (4, 4, 64, 32, True, True, 4, False, 1), (8, 8, 128, 8, True, False, 4, True, 4),
          (8, 8, 128, 16, True, False, 4, False, 4), (8, 4, 128, 16, True, True, 4, False, 1),
          (8, 4, 128, 16, True, True, 4, True, 1), (8, 8, 256, 8, True, False, 4, True, 4))


def matmul_schedules(t) -> dict[str, Schedule]:
    """The default schedule, a sweep of register tiles and workgroup sizes, and shared operand tiles
    (``shared_k``: operands staged through workgroup memory, :mod:`kiln.te.tiles`)."""
    out = {"default": default_schedule(t)}
    for ti, tj in ((4, 4), (4, 8), (8, 4), (8, 8)):
        for wg in (64, 256):
            for unroll in (1, 4, 8, 16):
                name = f"{ti}x{tj} wg{wg} unroll{unroll}"
                out[name] = Schedule(workgroup_size=wg, splits=(Split(0, ti, True), Split(1, tj)), unroll=unroll)
    for ti, tj, wg, kc, rows, cols, vw, pf, group in SHARED:
        layout = ('c' if rows else 's') + ('c' if cols else 'g' if group > 1 else 's')
        name = f"shared {ti}x{tj} wg{wg} k{kc} {layout} vec{vw}" + (" pf" * pf)
        out[name] = Schedule(workgroup_size=wg, splits=(Split(0, ti, rows), Split(1, tj, cols, group)), unroll=kc,
                             shared_k=kc, vector_width=vw, prefetch=pf)
    return out


def kiln_matmul(mkn: tuple[int, int, int], args, console: Console) -> dict:
    """Every schedule of the sweep on an (m x k) @ (k x n) matmul."""
    m, kd, n = mkn
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, kd)).astype(np.float32)
    b = rng.standard_normal((kd, n)).astype(np.float32)
    t = inline(library.build("MatMul", [placeholder((m, kd)), placeholder((kd, n))], {}, (m, n), "matmul"))
    flops = 2 * m * kd * n
    ref = a.astype(np.float64) @ b.astype(np.float64)
    rows = {}
    for name, sched in track(list(matmul_schedules(t).items()), description="matmul schedules", console=console):
        k = lower(t, sched)
        runner = KernelRunner(wgsl.render(k), [a, b], m * n, k.dispatch)
        got = runner.run().reshape(m, n)  # every schedule checked (a wrong fast kernel must not win)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        ms = statistics.median(runner.time(args.repeat, args.batch))
        rows[name] = {"schedule": k.schedule.to_json(), "median_ms": ms, "tflops": flops / ms / 1e9,
                      "max_rel_error": err}
        del runner
    ok = {r: v for r, v in rows.items() if v["max_rel_error"] < 1e-4}
    best = min(ok or rows, key=lambda r: rows[r]["median_ms"])
    return {"best": best, "schedules": rows}


def kiln_copy(elements: int, args) -> dict:
    """An identity kernel over ``elements`` fp32 values, one to eight elements per invocation."""
    x = placeholder((elements,))
    t = compute(x.shape, lambda i: x[i], "copy")
    data = np.arange(elements, dtype=np.float32)
    rows = {}
    for per in (1, 4, 8):
        sched = Schedule(workgroup_size=256, splits=(Split(0, per),) if per > 1 else ())
        k = lower(t, sched)
        runner = KernelRunner(wgsl.render(k), [data], elements, k.dispatch)
        assert np.array_equal(runner.run(), data)
        ms = statistics.median(runner.time(args.repeat, args.batch))
        rows[f"{per} per invocation"] = {"schedule": sched.to_json(), "median_ms": ms,
                                         "gb_per_s": 2 * 4 * elements / ms / 1e6}
        del runner
    best = min(rows, key=lambda r: rows[r]["median_ms"])
    return {"best": best, **rows[best], "schedules": rows}


def torch_rows(mkn: tuple[int, int, int], elements: int, args) -> dict:
    """PyTorch CUDA strict fp32 matmul and copy, timed with CUDA events."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    m, kd, n = mkn
    a = torch.randn(m, kd, device="cuda")
    b = torch.randn(kd, n, device="cuda")
    src = torch.randn(elements, device="cuda")
    dst = torch.empty_like(src)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        samples = []
        for _ in range(args.repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.batch):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / args.batch)
        return statistics.median(samples)

    mm = timed(lambda: torch.matmul(a, b))
    cp = timed(lambda: dst.copy_(src))
    return {"device": torch.cuda.get_device_name(), "matmul": {"median_ms": mm, "tflops": 2 * m * kd * n / mm / 1e9},
            "copy": {"median_ms": cp, "gb_per_s": 2 * 4 * elements / cp / 1e6}}


def main(argv: list[str] | None = None) -> dict:
    """Run the micro-benchmarks; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096, help="matmul N (N x N x N)")
    ap.add_argument("--mkn", default="", help="matmul M,K,N instead (MiniLM batch 32's FFN: 4096,384,1536)")
    ap.add_argument("--copy-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--batch", type=int, default=5, help="dispatches per timed submit")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console(width=140)
    from kiln.runtime.kernel import device

    info = device().adapter.info
    elements = args.copy_mib * 2**20 // 4
    mkn = tuple(int(x) for x in args.mkn.split(",")) if args.mkn else (args.size,) * 3
    if len(mkn) != 3:
        ap.error("--mkn takes M,K,N")
    record = {"benchmark": "micro", "size": args.size, "mkn": list(mkn), "copy_mib": args.copy_mib, "repeat": args.repeat,
              "batch": args.batch, "adapter": {k: info.get(k) for k in ("vendor", "device", "backend_type")},
              "kiln": {"matmul": kiln_matmul(mkn, args, console), "copy": kiln_copy(elements, args)}}
    if not args.no_torch:
        record["torch"] = torch_rows(mkn, elements, args)
    mm = record["kiln"]["matmul"]
    table = Table(title=f"matmul {'x'.join(map(str, mkn))} (MxKxN) fp32 and {args.copy_mib} MiB copy, median of {args.repeat}")
    for col in ("kernel", "contestant", "median ms", "rate", "kiln / torch rate", "max rel error"):
        table.add_column(col)
    peer = record.get("torch", {})
    for name, r in sorted(mm["schedules"].items(), key=lambda kv: kv[1]["median_ms"]):
        ratio = r["tflops"] / peer["matmul"]["tflops"] if peer else float("nan")
        table.add_row("matmul", f"kiln {name}", f"{r['median_ms']:.3f}", f"{r['tflops']:.3g} TFLOP/s", f"{ratio:.1%}",
                      f"{r['max_rel_error']:.1e}")
    if peer:
        table.add_row("matmul", "torch", f"{peer['matmul']['median_ms']:.3f}", f"{peer['matmul']['tflops']:.3g} TFLOP/s",
                      "")
    cp = record["kiln"]["copy"]
    for name, r in cp["schedules"].items():
        ratio = r["gb_per_s"] / peer["copy"]["gb_per_s"] if peer else float("nan")
        table.add_row("copy", f"kiln {name}", f"{r['median_ms']:.3f}", f"{r['gb_per_s']:.0f} GB/s", f"{ratio:.1%}")
    if peer:
        table.add_row("copy", "torch", f"{peer['copy']['median_ms']:.3f}", f"{peer['copy']['gb_per_s']:.0f} GB/s", "")
    console.print(table)
    path = write_record(record, args.out, "micro")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
