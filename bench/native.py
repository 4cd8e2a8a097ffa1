"""Kiln native (WGSL through wgpu-py) against onnxruntime (CPU) on the same machine, in one run.

Usage::

    python -m bench.native [--model models/mobilenet_v2_imagenet.onnx] [--repeat 20] [--warmup 3] [--out bench/results]

Prints a table of median / min / max milliseconds per run (after warm-up; first-run
time separately) and the Kiln / onnxruntime ratio, and writes the same numbers as
JSON (``native-<date>-<host>.json``) with the device, versions and commit.
Outputs are checked against onnxruntime before timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def _times(fn, repeat: int, warmup: int, progress: Progress, label: str) -> tuple[float, list[float]]:
    task = progress.add_task(label, total=1 + warmup + repeat)
    t0 = time.perf_counter()
    fn()
    cold = (time.perf_counter() - t0) * 1e3
    progress.advance(task)
    for _ in range(warmup):
        fn()
        progress.advance(task)
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
        progress.advance(task)
    return cold, out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


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
    args = ap.parse_args(argv)
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        session = kiln.load(kiln.compile(args.model, Path(tmp) / "pkg"))
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
        with Progress(console=console, transient=True) as progress:
            k_cold, k_times = _times(lambda: session.run(feeds), args.repeat, args.warmup, progress, "kiln native")
            o_cold, o_times = _times(lambda: ref.run(None, feeds), args.repeat, args.warmup, progress,
                                     "onnxruntime cpu")
        adapter = session.adapter_info()
    rows = {
        "kiln-native": {"median_ms": float(np.median(k_times)), "min_ms": min(k_times), "max_ms": max(k_times),
                        "cold_ms": k_cold, "device": f"{adapter.get('device')} ({adapter.get('backend_type')})"},
        "onnxruntime-cpu": {"median_ms": float(np.median(o_times)), "min_ms": min(o_times), "max_ms": max(o_times),
                            "cold_ms": o_cold, "device": platform.processor() or platform.machine()},
    }
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
    now = datetime.datetime.now(datetime.UTC)
    record = {"benchmark": "native", "date": now.isoformat(timespec="seconds"), "commit": _commit(),
              "host": platform.node(), "model": args.model.name, "repeat": args.repeat, "warmup": args.warmup,
              "results": rows, "ratio_kiln_over_onnxruntime": ratio, "max_abs_error": err,
              "versions": {"kiln": kiln.__version__, "onnxruntime": ort.__version__}}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"native-{args.model.stem}-{now:%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(record, indent=1))
    console.print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return record


if __name__ == "__main__":
    main()
