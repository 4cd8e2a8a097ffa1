"""Kiln native (WGSL through wgpu-py) against onnxruntime (CPU) on the same machine, in one run.

Usage::

    python -m bench.native [--model models/mobilenet_v2_imagenet.onnx] [--repeat 20] [--warmup 3] [--out bench/results]
                           [--precision fp32|fp16|fp16-acc16]

Prints a table of median / min / max milliseconds per run (after warm-up; first-run
time separately) and the Kiln / onnxruntime ratio, and writes the same numbers as
JSON (``native-<date>-<host>.json``) with the device, versions and commit.
Outputs are checked against onnxruntime before timing.
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

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "mobilenet_v2_imagenet.onnx")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "fp16-acc16"),
                    help="Kiln's precision (kiln compile --precision); python -m bench.precision compares them")
    args = ap.parse_args(argv)
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        session = kiln.load(kiln.compile(args.model, Path(tmp) / "pkg", precision=args.precision))
        compile_s = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in session.inputs}
        opts = ort.SessionOptions()
        if args.threads:
            opts.intra_op_num_threads = args.threads
        ref = ort.InferenceSession(str(args.model), opts, providers=["CPUExecutionProvider"])
        expected = ref.run(None, feeds)
        got = session.run(feeds)
        err = max(float(np.abs(got[o["name"]] - e).max()) for o, e in zip(session.outputs, expected))
        rows = {}
        adapter = session.adapter_info()
        kiln_device = f"{adapter.get('device')} ({adapter.get('backend_type')})"
        contestants = [("kiln-native", lambda: session.run(feeds), kiln_device),
                       ("onnxruntime-cpu", lambda: ref.run(None, feeds), platform.processor() or platform.machine())]
        with Progress(console=console, transient=True) as progress:
            for name, fn, device in contestants:
                task = progress.add_task(name, total=1 + args.warmup + args.repeat)
                cold, times = time_runs(fn, args.repeat, args.warmup, lambda t=task: progress.advance(t))
                rows[name] = {**summary(times, cold), "device": device}
    ratio = rows["kiln-native"]["median_ms"] / rows["onnxruntime-cpu"]["median_ms"]
    table = Table(title=f"{args.model.name}: median of {args.repeat} runs after {args.warmup} warm-up")
    for col in ("contestant", "device", "median ms", "min ms", "max ms", "first run ms"):
        table.add_column(col, justify="right" if "ms" in col else "left")
    for name, r in rows.items():
        table.add_row(name, r["device"], f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                      f"{r['cold_ms']:.2f}")
    console.print(table)
    console.print(f"kiln / onnxruntime = {ratio:.2f}x (lower is better); max abs error vs onnxruntime {err:.2e}; "
                  f"compile + load {compile_s:.1f} s")
    record = {"benchmark": "native", "model": args.model.name, "precision": args.precision, "repeat": args.repeat,
              "warmup": args.warmup,
              "results": rows, "ratio_kiln_over_onnxruntime": ratio, "max_abs_error": err,
              "versions": {"kiln": kiln.__version__, "onnxruntime": ort.__version__}}
    path = write_record(record, args.out, f"native-{args.model.stem}")
    console.print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return record


if __name__ == "__main__":
    main()
