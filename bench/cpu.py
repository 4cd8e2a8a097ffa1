"""Kiln's native cpu target against onnxruntime CPU, one thread and every thread, in one run.

Usage::

    python -m bench.cpu [--models mobilenet,minilm,ocr-det] [--repeat 20] [--warmup 3] [--threads N]
                        [--out bench/results]

For each model: compiles it for the ``cpu`` target (the C kernels built for this machine, ``-O3
-march=native``), checks Kiln's outputs against onnxruntime, then times full runs (inputs written, every
kernel, outputs read) of Kiln and of onnxruntime's CPU execution provider with one thread and with ``N``
threads (default: every core this process may use; ``intra_op_num_threads`` for onnxruntime). Prints a
table of median / min / max / first-run milliseconds and the Kiln / onnxruntime ratios, and writes the same
numbers as JSON (``cpu-<date>.json``) with the CPU, versions and the commit.

The issue's goal: MobileNetV2 with one thread within 2x of onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.common import ROOT, summary, time_runs, write_record

SHARED = ROOT.parent / "shared" / "models"

#: name -> (model path, dims to bind, input maker(rng) -> feeds)
MODELS = {
    "mobilenet": (ROOT / "models" / "mobilenet_v2_imagenet.onnx", None,
                  lambda rng: {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}),
    "minilm": (SHARED / "all_minilm_l6_v2.onnx", {"batch": 1, "seq": 128},
               lambda rng: {"input_ids": rng.integers(1000, 20000, (1, 128)).astype(np.int64),
                            "attention_mask": np.ones((1, 128), np.int64),
                            "token_type_ids": np.zeros((1, 128), np.int64)}),
    "ocr-det": (SHARED / "ch_PP-OCRv4_det_infer.onnx",
                {"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 320, "p2o.DynamicDimension.2": 320},
                lambda rng: {"x": rng.uniform(-1, 1, (1, 3, 320, 320)).astype(np.float32)}),
}


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    import onnxruntime as ort

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="the many-thread count")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console()
    counts = sorted({1, max(1, args.threads)})
    cpu = platform.processor() or platform.machine()
    record: dict = {"benchmark": "cpu", "cpu": cpu, "cores": len(os.sched_getaffinity(0)), "repeat": args.repeat,
                    "warmup": args.warmup, "models": {},
                    "versions": {"kiln": kiln.__version__, "onnxruntime": ort.__version__}}
    for name in args.models.split(","):
        path, dims, make = MODELS[name]
        rng = np.random.default_rng(0)
        feeds = make(rng)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            pkg = kiln.compile(path, Path(tmp) / "pkg", target="cpu", dims=dims, progress=True)
            compile_s = time.perf_counter() - t0
            sessions = {n: kiln.load(pkg, target="cpu", threads=n) for n in counts}
            refs = {}
            for n in counts:
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = n
                refs[n] = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            expected = refs[1].run(None, feeds)
            err = 0.0
            for s in sessions.values():
                got = s.run(feeds)
                err = max(err, *(float(np.abs(got[o["name"]] - e).max()) for o, e in zip(s.outputs, expected)))
            rows: dict[str, dict] = {}
            with Progress(console=console, transient=True) as progress:
                for n in counts:
                    for who, fn in ((f"kiln-cpu {n}t", lambda s=sessions[n], f=feeds: s.run(f)),
                                    (f"onnxruntime-cpu {n}t", lambda r=refs[n], f=feeds: r.run(None, f))):
                        task = progress.add_task(f"{name}: {who}", total=1 + args.warmup + args.repeat)
                        cold, times = time_runs(fn, args.repeat, args.warmup, lambda t=task: progress.advance(t))
                        rows[who] = {**summary(times, cold), "threads": n}
        ratios = {f"{n}t": rows[f"kiln-cpu {n}t"]["median_ms"] / rows[f"onnxruntime-cpu {n}t"]["median_ms"]
                  for n in counts}
        table = Table(title=f"{path.name} on {cpu}: median of {args.repeat} runs after {args.warmup} warm-up")
        for col in ("contestant", "median ms", "min ms", "max ms", "first run ms"):
            table.add_column(col, justify="right" if "ms" in col else "left")
        for who, r in rows.items():
            table.add_row(who, f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                          f"{r['cold_ms']:.2f}")
        console.print(table)
        console.print("kiln-cpu / onnxruntime-cpu = " + ", ".join(f"{v:.2f}x ({k})" for k, v in ratios.items())
                      + f" (lower is better); max abs error vs onnxruntime {err:.2e}; compile {compile_s:.1f} s")
        record["models"][name] = {"model": path.name, "dims": dims, "results": rows,
                                  "ratio_kiln_over_onnxruntime": ratios, "max_abs_error": err, "compile_s": compile_s}
    out = write_record(record, args.out, "cpu")
    console.print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return record


if __name__ == "__main__":
    main()
