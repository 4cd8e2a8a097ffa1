"""Kiln's generated matrix products against hand-written WGSL GEMMs and cuBLAS: how far the generated kernels are from
what WGSL can reach on this GPU (issue 16), fp32 and f16.

Run on the lent GPU machine (recipe: ../shared/gpu/README.md)::

    source bench/gpu_enter.sh; python3 -m bench.gemm_hand --out $OUT

or here (lavapipe), small: ``python -m bench.gemm_hand --shapes 128x64x128 --rounds 1``.

``C[M, N] = A[M, K] @ B[K, N]``, row-major, MiniLM 32 x 128's products by default (``4096x384x1152``: Q, K and V in
one; ``4096x384x384``: the attention's output; ``4096x384x1536`` and ``4096x1536x384``: the FFN) and 4096^3.
Contestants:

- ``kiln default``: the compiler's schedule (:func:`kiln.te.schedule.default_schedule`), and ``kiln ...``: the MatMul
  tensor expression under other shared-tile schedules (``wgW RxC kK``: workgroup size, register tile, chunk; ``g``:
  columns in strided vec4 groups, ``s``: strided, ``c``: contiguous; ``pf``: prefetch);
- ``hand BMxBN tTMxTN kBK``: :func:`hand_gemm`, the classic blocked SGEMM written directly in WGSL (blocks of BM x BN
  outputs, TM x TN a thread, A's chunk stored transposed with padding, B's as vec4, both loaded from storage as vec4,
  two workgroup buffers so one barrier a chunk); its f16 forms read f16 operands and accumulate ``mixed`` (f16
  products and sums over each chunk, added to f32 accumulators: packed ``vec4<f16>`` FMAs) or ``acc16`` (f16 all
  the way), with ``scalar`` f16 accumulators instead of ``vec4<f16>`` ones; ``single``: one buffer and two barriers;
- ``kiln fp16 default`` and ``kiln fp16-acc16 default``: the product as ``kiln compile --precision fp16`` (and
  ``fp16-acc16``) makes it: f16 operands, f32 (f16) accumulation, f16 output, the default schedule;
- ``torch float32`` (cuBLAS, TF32 off) and ``torch float16`` (tensor cores) on the same GPU.

Every kernel is checked against numpy (float64; the f16 ones against the product of the f16-rounded operands) before it
is timed; ``max rel error`` is the largest error over the largest output. Kernels are timed in turn, ``--rounds``
times (each a median of GPU timestamp samples of 10 back-to-back dispatches), so a clock change of the GPU falls on
all of them; the table gives the median over rounds. Prints a table a shape and writes JSON (``gemm-hand-<date>.json``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record
from kiln.arith.expr import cast
from kiln.codegen.webgpu import wgsl
from kiln.kernels import library
from kiln.runtime.kernel import KernelRunner
from kiln.te.compute import compute, inline, placeholder
from kiln.te.half import demote
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, Split, default_schedule

SHAPES = ("4096x384x1152", "4096x384x384", "4096x384x1536", "4096x1536x384", "4096x4096x4096")

#: kiln compile's f16 precisions and their accumulation (kiln.compiler.PRECISIONS)
PRECISIONS = {"fp16": "float32", "fp16-acc16": "float16"}
#: hand-written kernels: (BM, BN, TM, TN, BK) and the f16 forms of each
HAND = ((64, 128, 8, 8, 8), (128, 128, 8, 8, 16), (64, 64, 4, 4, 16))


def hand_gemm(m: int, k: int, n: int, bm: int = 64, bn: int = 128, tm: int = 8, tn: int = 8, bk: int = 8,
              half: str | None = None, double: bool = True, pad: int = 4, packed: bool = True) -> tuple[str, int]:
    """WGSL of the blocked GEMM ``C = A @ B`` (bindings A, B as ``array<vec4<T>>``, C ``array<vec4<f32>>``) and its
    workgroup count. ``half``: ``None`` (f32), ``"mixed"`` or ``"acc16"`` (f16 operands; see the module docstring);
    ``packed``: f16 accumulators as ``vec4<f16>`` (else scalars, one FMA an output, for the driver to pair or not).

    Raises:
        ValueError: the shape is not a multiple of the blocks, or the loads do not divide among the invocations."""
    tx, ty = bn // tn, bm // tm
    nt = tx * ty
    la, lb = bm * bk // 4 // nt, bk * bn // 4 // nt  # vec4 loads of A and of B per invocation and chunk
    if m % bm or n % bn or k % bk or tn % 4 or tm % 4 or la * nt * 4 != bm * bk or lb * nt * 4 != bk * bn:
        raise ValueError(f"{m}x{k}x{n} does not tile as {bm}x{bn} blocks of {tm}x{tn} in chunks of {bk}")
    sa = bm + pad  # words of A's transposed chunk per reduction step
    s = "f16" if half else "f32"
    lines: list[str] = []
    w = lines.append
    if half:
        w("enable f16;")
    w(f"@group(0) @binding(0) var<storage, read> A: array<vec4<{s}>>;")
    w(f"@group(0) @binding(1) var<storage, read> B: array<vec4<{s}>>;")
    w("@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;")
    nbuf = 2 if double else 1
    w(f"var<workgroup> As: array<vec4<{s}>, {nbuf * bk * sa // 4}>;")
    w(f"var<workgroup> Bs: array<vec4<{s}>, {nbuf * bk * bn // 4}>;")
    w(f"@compute @workgroup_size({nt})")
    w("fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {")
    w("  let l = i32(lid);")
    w(f"  let bm = i32(wg.x) / {n // bn}; let bn = i32(wg.x) % {n // bn};")
    w(f"  let tx = l % {tx}; let ty = l / {tx};")
    tiles = [(i, g) for i in range(tm) for g in range(tn // 4)]
    for i, g in tiles:
        w(f"  var c{i}_{g} = vec4<f32>(0.0);")
        if half and packed:
            w(f"  var h{i}_{g} = vec4<f16>(0.0);")
        elif half:
            for c in range(4):
                w(f"  var h{i}_{g}_{c} = f16(0.0);")

    def load(t, reg):
        for r in range(la):  # A: vec4 v -> row v / (bk/4), reduction quad v % (bk/4)
            w(f"  let va{reg}{r} = l + {r * nt};")
            w(f"  let ra{reg}{r} = A[((bm * {bm} + va{reg}{r} / {bk // 4}) * {k} + {t} * {bk} + "
              f"(va{reg}{r} % {bk // 4}) * 4) / 4];")
        for r in range(lb):  # B: vec4 v -> reduction row v / (bn/4), column quad v % (bn/4)
            w(f"  let vb{reg}{r} = l + {r * nt};")
            w(f"  let rb{reg}{r} = B[(({t} * {bk} + vb{reg}{r} / {bn // 4}) * {n} + bn * {bn}) / 4 + "
              f"vb{reg}{r} % {bn // 4}];")

    def store(buf, reg):
        for r in range(la):
            for c in range(4):
                w(f"  {{ let e = {buf} * {bk * sa} + ((va{reg}{r} % {bk // 4}) * 4 + {c}) * {sa} + "
                  f"va{reg}{r} / {bk // 4}; As[e / 4][e % 4] = ra{reg}{r}[{c}]; }}")
        for r in range(lb):
            w(f"  Bs[{buf} * {bk * bn // 4} + vb{reg}{r}] = rb{reg}{r};")

    def compute(buf):
        for kk in range(bk):
            w("    {")
            for q in range(tm // 4):
                w(f"    let a{q} = As[{buf} * {bk * sa // 4} + {kk * sa // 4} + ty * {tm // 4} + {q}];")
            for g in range(tn // 4):
                w(f"    let b{g} = Bs[{buf} * {bk * bn // 4} + {kk * bn // 4} + {g * tx} + tx];")
            for i, g in tiles:
                a = f"a{i // 4}[{i % 4}]"
                if half and packed:
                    w(f"    h{i}_{g} = fma(vec4<f16>({a}), b{g}, h{i}_{g});")
                elif half:
                    for c in range(4):
                        w(f"    h{i}_{g}_{c} = fma({a}, b{g}[{c}], h{i}_{g}_{c});")
                else:
                    w(f"    c{i}_{g} = fma(vec4<f32>({a}), b{g}, c{i}_{g});")
            w("    }")
        if half == "mixed":
            for i, g in tiles:
                if packed:
                    w(f"    c{i}_{g} = c{i}_{g} + vec4<f32>(h{i}_{g}); h{i}_{g} = vec4<f16>(0.0);")
                else:
                    hs = ", ".join(f"h{i}_{g}_{c}" for c in range(4))
                    w(f"    c{i}_{g} = c{i}_{g} + vec4<f32>(vec4<f16>({hs}));")
                    for c in range(4):
                        w(f"    h{i}_{g}_{c} = f16(0.0);")

    chunks = k // bk
    if double:
        w("  {")
        load(0, "p")
        store(0, "p")
        w("  }")
        w("  workgroupBarrier();")
        w(f"  for (var t = 0; t < {chunks}; t++) {{")
        w("    let cur = t % 2;")
        w(f"    let nt = min(t + 1, {chunks - 1});")
        load("nt", "n")
        w("    {")
        compute("cur")
        w("    }")
        w(f"    if (t + 1 < {chunks}) {{")
        store("(1 - cur)", "n")
        w("    }")
        w("    workgroupBarrier();")
        w("  }")
    else:
        w(f"  for (var t = 0; t < {chunks}; t++) {{")
        load("t", "n")
        store(0, "n")
        w("    workgroupBarrier();")
        w("    {")
        compute(0)
        w("    }")
        w("    workgroupBarrier();")
        w("  }")
    for i, g in tiles:
        h = f"h{i}_{g}" if packed else "vec4<f16>(" + ", ".join(f"h{i}_{g}_{c}" for c in range(4)) + ")"
        v = f"vec4<f32>({h})" if half == "acc16" else f"c{i}_{g}"
        w(f"  C[((bm * {bm} + ty * {tm} + {i}) * {n} + bn * {bn}) / 4 + {g * tx} + tx] = {v};")
    w("}")
    return "\n".join(lines), (m // bm) * (n // bn)


def kiln_schedules(t) -> dict[str, Schedule]:
    """The default schedule and shared-tile alternatives around it."""
    def s(wg, fa, fb, kc, group=4, contiguous=False, pf=False):
        cols = Split(1, fb, contiguous, group if group < fb else 1)
        return Schedule(wg, splits=(Split(0, fa, True), cols), unroll=kc, shared_k=kc, vector_width=4, prefetch=pf)

    return {"kiln default": default_schedule(t),
            "kiln wg128 8x8 k8 g pf": s(128, 8, 8, 8, pf=True), "kiln wg128 8x8 k8 g": s(128, 8, 8, 8),
            "kiln wg128 8x8 k16 g": s(128, 8, 8, 16), "kiln wg128 8x4 k16 c": s(128, 8, 4, 16, contiguous=True),
            "kiln wg128 8x4 k16 c pf": s(128, 8, 4, 16, contiguous=True, pf=True),
            "kiln wg64 8x8 k16 g": s(64, 8, 8, 16), "kiln wg256 8x8 k8 s": s(256, 8, 8, 8, group=1),
            "kiln wg256 4x4 k16 s": s(256, 4, 4, 16, group=1)}


def candidates(m: int, k: int, n: int, rng: np.random.Generator) -> dict[str, tuple]:
    """``{name: (wgsl, inputs, dispatch, reference[, output dtype])}`` of every contestant kernel of one shape."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    ref16 = a16.astype(np.float64) @ b16.astype(np.float64)
    t = inline(library.build("MatMul", [placeholder((m, k)), placeholder((k, n))], {}, (m, n), "matmul"))
    out = {}
    for name, sched in kiln_schedules(t).items():
        kern = lower(t, sched)
        out[name] = (wgsl.render(kern), [a, b], kern.dispatch, ref)
    for precision, accumulate in PRECISIONS.items():  # kiln compile --precision's kernels of the product
        ins = [placeholder(s, "float16", f"in{i}") for i, s in enumerate(((m, k), (k, n)))]
        views = [compute(x.shape, lambda *i, x=x: cast(x[i], "float32")) for x in ins]
        prod = library.build("MatMul", views, {}, (m, n), "matmul")
        t16 = demote(inline(compute(prod.shape, lambda *i, p=prod: cast(p[i], "float16"))), accumulate)
        kern = lower(t16, default_schedule(t16))
        out[f"kiln {precision} default"] = (wgsl.render(kern), [a16, b16], kern.dispatch, ref16, np.float16)
    for bm, bn, tm, tn, bk in HAND:
        for half, double, packed in ((None, True, True), (None, False, True), ("mixed", True, True),
                                     ("acc16", True, True), ("mixed", True, False), ("acc16", True, False)):
            kc = max(bk, 16) if half == "mixed" else bk
            name = f"hand {bm}x{bn} t{tm}x{tn} k{kc}" + (f" {half}" if half else "") + ("" if double else " single") \
                + ("" if packed else " scalar")
            try:
                src, groups = hand_gemm(m, k, n, bm, bn, tm, tn, kc, half, double, packed=packed)
            except ValueError:
                continue
            out[name] = (src, [a16, b16] if half else [a, b], (groups, 1, 1), ref16 if half else ref)
    return out


def torch_rows(m: int, k: int, n: int, rounds: int) -> dict[str, float]:
    """cuBLAS ms of the product in float32 (TF32 off) and float16, medians of CUDA-event samples of 10 products."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for dt in (torch.float32, torch.float16):
        a = torch.randn(m, k, device="cuda", dtype=dt)
        b = torch.randn(k, n, device="cuda", dtype=dt)
        for _ in range(5):
            torch.matmul(a, b)
        samples = []
        for _ in range(rounds * 3):
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s0.record()
            for _ in range(10):
                torch.matmul(a, b)
            s1.record()
            torch.cuda.synchronize()
            samples.append(s0.elapsed_time(s1) / 10)
        out[f"torch {str(dt).split('.')[-1]}"] = statistics.median(samples)
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run every contestant on every shape; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="MxKxN products, comma-separated")
    ap.add_argument("--rounds", type=int, default=7, help="times every kernel is timed, in turn")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console(width=150)
    from kiln.runtime.gpu import adapter, shared_device

    if "shader-f16" in adapter().features:  # the f16 contestants need it; the others run on the same device
        shared_device(features=("shader-f16",))
    record = {"benchmark": "gemm-hand", "rounds": args.rounds, "shapes": {}}
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        try:
            m, k, n = (int(x) for x in shape.split("x"))
        except ValueError:
            ap.error(f"--shapes takes MxKxN products, not {shape!r}")
        runners, errors = {}, {}
        for name, (src, inputs, dispatch, ref, *dtype) in candidates(m, k, n, rng).items():
            if "f16" in src and "shader-f16" not in adapter().features:
                continue
            runner = KernelRunner(src, inputs, m * n, dispatch, out_dtype=dtype[0] if dtype else np.float32)
            errors[name] = float(np.abs(runner.run().reshape(m, n) - ref).max() / np.abs(ref).max())
            runners[name] = runner
        samples: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.rounds):
            for name, runner in runners.items():
                ms = runner.gpu_time(repeat=3, batch=10, warmup=1) or runner.time(repeat=3, batch=10, warmup=1)
                samples[name].append(statistics.median(ms))
        flops = 2 * m * k * n
        rows = {name: {"median_ms": statistics.median(v), "tflops": flops / statistics.median(v) / 1e9,
                       "max_rel_error": errors[name]} for name, v in samples.items()}
        if not args.no_torch:
            rows.update({name: {"median_ms": ms, "tflops": flops / ms / 1e9}
                         for name, ms in torch_rows(m, k, n, args.rounds).items()})
        record["shapes"][shape] = rows
        del runners
        table = Table(title=f"C[{m}, {n}] = A[{m}, {k}] @ B[{k}, {n}], GPU ms (median of {args.rounds} rounds)")
        for col in ("kernel", "ms", "TFLOP/s", "default / this", "max rel error"):
            table.add_column(col, justify="left" if col == "kernel" else "right")
        base = rows["kiln default"]["median_ms"]
        for name, r in sorted(rows.items(), key=lambda kv: kv[1]["median_ms"]):
            err = r.get("max_rel_error")
            table.add_row(name, f"{r['median_ms']:.4f}", f"{r['tflops']:.1f}", f"{base / r['median_ms']:.2f}",
                          "-" if err is None else f"{err:.1e}")
        console.print(table)
    console.print(f"wrote {write_record(record, args.out, 'gemm-hand')}")
    return record


if __name__ == "__main__":
    main()
