"""Kiln's WebAssembly target natively (wasmtime) against onnxruntime CPU, single-threaded, in one run.

Usage::

    python -m bench.wasm [--model models/mobilenet_v2_imagenet.onnx] [--repeat 20] [--warmup 3] [--threads 2]
                         [--out bench/results]

Compiles the model for the ``wasm`` target, checks Kiln's outputs against onnxruntime, then times
full runs (inputs written, every kernel, outputs read) of Kiln on wasmtime with one thread and
onnxruntime's CPU execution provider with ``intra_op_num_threads=1``, and, with ``--threads N`` > 1,
both again with N threads (Kiln's threaded module over a shared memory). Prints a table of median /
min / max / first-run milliseconds and the Kiln / onnxruntime ratios, and writes the same numbers as
JSON (``wasm-<model>-<date>.json``) with versions and the commit.

onnxruntime here runs native x86 code (AVX2/AVX-512, FMA); Kiln runs 128-bit WebAssembly SIMD
without FMA, so this is a harder comparison than the acceptance one (onnxruntime-web's wasm
backend in the same browser, ``bench/browser.py --contestants kiln-wasm,ort-wasm``).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.common import ROOT, summary, time_runs, write_record


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    import onnxruntime as ort
    import wasmtime  # noqa: F401  (fail early when missing)

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "mobilenet_v2_imagenet.onnx")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="also time with this many threads (Kiln and onnxruntime)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console()
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        pkg = kiln.compile(args.model, Path(tmp) / "pkg", target="wasm", wasm_threads=args.threads > 1)
        compile_s = time.perf_counter() - t0
        counts = [1] + ([args.threads] if args.threads > 1 else [])
        sessions = {n: kiln.load(pkg, target="wasm", threads=n) for n in counts}
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in sessions[1].inputs}
        refs = {}
        for n in counts:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = n
            refs[n] = ort.InferenceSession(str(args.model), opts, providers=["CPUExecutionProvider"])
        expected = refs[1].run(None, feeds)
        err = 0.0
        for s in sessions.values():
            got = s.run(feeds)
            err = max(err, *(float(np.abs(got[o["name"]] - e).max()) for o, e in zip(s.outputs, expected)))
        cpu = platform.processor() or platform.machine()
        contestants = []
        for n in counts:
            contestants.append((f"kiln-wasm {n}t", n, lambda s=sessions[n]: s.run(feeds),
                                f"wasmtime, SIMD128, {n} thread{'s' if n > 1 else ''}"))
            contestants.append((f"onnxruntime-cpu {n}t", n, lambda r=refs[n]: r.run(None, feeds),
                                f"{cpu}, {n} thread{'s' if n > 1 else ''}"))
        with Progress(console=console, transient=True) as progress:
            for name, n, fn, device in contestants:
                task = progress.add_task(name, total=1 + args.warmup + args.repeat)
                cold, times = time_runs(fn, args.repeat, args.warmup, lambda t=task: progress.advance(t))
                rows[name] = {**summary(times, cold), "device": device, "threads": n}
        for s in sessions.values():
            s.close()
    ratios = {f"{n}t": rows[f"kiln-wasm {n}t"]["median_ms"] / rows[f"onnxruntime-cpu {n}t"]["median_ms"]
              for n in counts}
    table = Table(title=f"{args.model.name}: median of {args.repeat} runs after {args.warmup} warm-up")
    for col in ("contestant", "device", "median ms", "min ms", "max ms", "first run ms"):
        table.add_column(col, justify="right" if "ms" in col else "left")
    for name, r in rows.items():
        table.add_row(name, r["device"], f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                      f"{r['cold_ms']:.2f}")
    console.print(table)
    console.print("kiln-wasm / onnxruntime-cpu = " + ", ".join(f"{v:.2f}x ({k})" for k, v in ratios.items())
                  + f" (lower is better); max abs error vs onnxruntime {err:.2e}; compile {compile_s:.1f} s")
    record = {"benchmark": "wasm", "model": args.model.name, "repeat": args.repeat, "warmup": args.warmup,
              "results": rows, "ratio_kiln_over_onnxruntime": ratios, "max_abs_error": err, "compile_s": compile_s,
              "versions": {"kiln": kiln.__version__, "onnxruntime": ort.__version__}}
    path = write_record(record, args.out, f"wasm-{args.model.stem}")
    console.print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return record


if __name__ == "__main__":
    main()
