"""Kiln's browser targets in one headless Chromium page: WebGPU, WebGL2 and WebAssembly (one thread and
workers), on one package holding all three, against onnxruntime (CPU, in Python) for reference.

Usage::

    python -m bench.browser_targets [--model models/mobilenet_v2_imagenet.onnx] [--repeat 5] [--warmup 1]
                                    [--threads 2] [--out bench/results]

Chromium runs WebGPU and WebGL2 on SwiftShader (the CPU) here, so those numbers say what a machine
without a GPU gets, not what a GPU does. For each target the page loads the package with
``kiln.load(url, {target, threads})`` (load time: download, SHA-256, compile, upload), runs it once
(first run, checked against onnxruntime) and times ``repeat`` runs after ``warmup`` with
``Session.time`` (wall clock of the kernels, inputs written once, no readback). Prints a table and
writes JSON (``browser-<model>-<date>.json``).
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record

#: loads the package with options, runs it once (outputs back) and times it; milliseconds
MEASURE = """async ({options, feeds, repeat, warmup}) => {
  const kiln = await import('./kiln.js');
  const arrays = {float32: Float32Array, int32: Int32Array, int64: BigInt64Array};
  const decode = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0)).buffer;
  const inputs = {};
  for (const [name, {type, dims, data}] of Object.entries(feeds)) {
    inputs[name] = new kiln.Tensor(type, new arrays[type](decode(data)), dims);
  }
  const t0 = performance.now();
  const session = await kiln.load('./', options);
  const load = performance.now() - t0;
  const t1 = performance.now();
  const outputs = await session.run(inputs);
  const first = performance.now() - t1;
  const {times} = await session.time(inputs, {repeat, warmup, clock: 'wall'});
  const info = session.adapterInfo;
  const device = [info.vendor, info.architecture, info.device].filter(Boolean).join(' ');
  const result = {target: session.target, device, load, first, times,
                  outputs: Object.fromEntries(Object.entries(outputs).map(([k, t]) => [k, Array.from(t.data, Number)]))};
  session.destroy();
  return result;
}"""


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "tests"))
    from browser import ConsoleLog, launch_chromium, serving
    from playwright.sync_api import sync_playwright

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "mobilenet_v2_imagenet.onnx")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="wasm worker threads of the threaded row")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with console.status("compiling for webgpu, webgl2 and wasm"):
            pkg = kiln.compile(args.model, Path(tmp) / "pkg", target="webgpu,webgl2,wasm", device_class="cpu")
        compile_s = time.perf_counter() - t0
        manifest = kiln.load(pkg).manifest  # native session: inputs' dtypes and shapes
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(np.float32) for i in manifest["inputs"]}
        expected = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"]).run(None, feeds)
        wire = {k: {"type": "float32", "dims": list(v.shape), "data": base64.b64encode(v.tobytes()).decode()}
                for k, v in feeds.items()}
        runs = [("webgpu", {"target": "webgpu"}), ("webgl2", {"target": "webgl2"}),
                ("wasm, 1 thread", {"target": "wasm", "threads": 1}),
                (f"wasm, {args.threads} threads", {"target": "wasm", "threads": args.threads})]
        with sync_playwright() as playwright, serving(pkg) as url:
            browser = launch_chromium(playwright)
            page = browser.new_page()
            log = ConsoleLog(page)
            page.goto(url + "manifest.json")
            for name, options in runs:
                with console.status(f"{name}: load, run, {args.warmup} + {args.repeat} timed runs"):
                    r = log.evaluate(MEASURE, {"options": options, "feeds": wire, "repeat": args.repeat,
                                               "warmup": args.warmup})
                outs = r.pop("outputs")
                err = max(float(np.abs(np.array(outs[o["name"]]).reshape(e.shape) - e).max())
                          for o, e in zip(manifest["outputs"], expected))
                times = r.pop("times")
                rows[name] = {**r, "median_ms": float(np.median(times)), "min_ms": float(np.min(times)),
                              "max_ms": float(np.max(times)), "times_ms": times, "max_abs_error": err}
            browser.close()
    table = Table(title=f"{args.model.name} in headless Chromium: median of {args.repeat} runs after {args.warmup}")
    for col in ("target", "device", "median ms", "min ms", "first run ms", "load ms", "max abs error"):
        table.add_column(col, justify="left" if col in ("target", "device") else "right")
    for name, r in rows.items():
        table.add_row(name, r["device"][:32], f"{r['median_ms']:.1f}", f"{r['min_ms']:.1f}", f"{r['first']:.1f}",
                      f"{r['load']:.1f}", f"{r['max_abs_error']:.1e}")
    console.print(table)
    console.print(f"compile for three targets: {compile_s:.1f} s")
    record = {"benchmark": "browser", "model": args.model.name, "repeat": args.repeat, "warmup": args.warmup,
              "results": rows, "compile_s": compile_s, "versions": {"kiln": kiln.__version__}}
    path = write_record(record, args.out, f"browser-{args.model.stem}")
    console.print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return record


if __name__ == "__main__":
    main()
