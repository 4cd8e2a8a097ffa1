"""Packages with run-time dims against a static package of the same model, at one shape, in one run.

Usage::

    python -m bench.dynamic [--model minilm|mobilenet] [--target webgpu|wasm|cpu] [--batch 1] [--seq 128]
                            [--device-class cpu] [--repeat 10] [--warmup 2] [--out bench/results]

Compiles the model three times: ``static`` (``--dim batch=B --dim seq=S``), ``bounded`` (run-time dims:
``--dim batch=1..4 --dim seq=1..512@S``; MobileNetV2: ``--dim N=1..4@B``) and ``default`` (no ``--dim``: the
symbolic dims become growable run-time dims, docs/dynamic-shapes.md *Growable buffers*), checks each against
onnxruntime, and prints median / min / max milliseconds per run (after warm-up, the packages' runs interleaved;
first run separately) and each one's ratio to static; writes the same as JSON (``dynamic-<date>.json``). Packages
with run-time dims read them from a uniform (webgpu) or an array (wasm, cpu), so index arithmetic divides by
run-time values instead of constants and some loops lose their constant trip counts.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, summary, time_runs, write_record

MODELS = {"minilm": ROOT.parent / "shared" / "models" / "all_minilm_l6_v2.onnx",
          "mobilenet": ROOT / "models" / "mobilenet_v2_imagenet.onnx"}


def _setup(model: str, batch: int, seq: int) -> tuple[dict, dict[str, dict], str]:
    """The feeds, the three packages' dims and the output compared, for ``model``."""
    if model == "minilm":
        from tools.dynamic_minilm import feeds

        f = feeds(np.random.default_rng(0), batch, seq)
        return f, {"static": {"batch": batch, "seq": seq}, "bounded": {"batch": (1, 4), "seq": (1, 512, seq)},
                   "default": {}}, "last_hidden_state"
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    return {"input": x}, {"static": {"N": batch}, "bounded": {"N": (1, 4, batch)}, "default": {}}, "logits"


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    import onnxruntime as ort

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="minilm")
    ap.add_argument("--onnx", type=Path, help="the model's ONNX file, if not the shared one (bench.gpu exports a "
                    "MiniLM with random weights on machines without ../shared)")
    ap.add_argument("--target", choices=["webgpu", "wasm", "cpu"], default="webgpu")
    ap.add_argument("--device-class", choices=["gpu", "cpu"], default="cpu",
                    help="the schedules' device class (webgpu: gpu on a real GPU, cpu on lavapipe)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128, help="MiniLM's sequence length")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console()
    path = args.onnx or MODELS[args.model]
    f, variants, output = _setup(args.model, args.batch, args.seq)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run([output], f)[0]
    results, sessions, colds = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims in variants.items():
            with console.status(f"compiling the {name} package"):
                pkg = kiln.compile(path, Path(tmp) / name, dims=dims, target=args.target,
                                   device_class=args.device_class, validate=False)
                sessions[name] = kiln.load(pkg, target=args.target)
            colds[name], _ = time_runs(lambda s=sessions[name]: s.run(f), 0, args.warmup)
        # interleaved, so load from other processes on a shared machine hits every package alike
        times: dict[str, list[float]] = {name: [] for name in variants}
        with console.status("timing (interleaved)"):
            for _ in range(args.repeat):
                for name, session in sessions.items():
                    times[name] += time_runs(lambda s=session: s.run(f), 1, 0)[1]
        for name, dims in variants.items():
            err = float(np.abs(sessions[name].run(f)[output] - want).max())
            results[name] = {**summary(times[name], colds[name]), "max_abs_error": err,
                             "dims": {k: list(v) if isinstance(v, tuple) else v for k, v in dims.items()}}
    for r in results.values():
        r["over_static"] = r["median_ms"] / results["static"]["median_ms"]
    shape = f"batch={args.batch}" + (f" seq={args.seq}" if args.model == "minilm" else "")
    table = Table(title=f"{path.name} {shape}, {args.target} (native), device class {args.device_class}")
    for col in ("package", "median ms", "min ms", "max ms", "first ms", "/ static", "max abs err vs onnxruntime"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                      f"{r['cold_ms']:.1f}", f"{r['over_static']:.2f}x", f"{r['max_abs_error']:.1e}")
    console.print(table)
    device = "?"
    if args.target == "webgpu":
        from kiln.runtime import gpu

        device = gpu.adapter().info.get("device", "?")
    record = {"benchmark": "dynamic", "model": path.name, "target": args.target, "device_class": args.device_class,
              "batch": args.batch, "seq": args.seq if args.model == "minilm" else None, "device": device,
              "results": results}
    out = write_record(record, args.out, "dynamic")
    console.print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
