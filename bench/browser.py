"""Kiln against onnxruntime-web in one page of headless Chromium (issue 6's browser mode).

Both runtimes load the same ONNX model in the same page and run the same input; each run is
timed from ``run()`` to its outputs on the CPU (upload, compute and readback, as a web page sees
it). Outputs are checked against onnxruntime CPU in Python. Prints a table with the ratio
Kiln / onnxruntime-web and writes JSON (``browser-<date>.json``)::

    .venv/bin/python -m bench.browser                       # MobileNetV2, WebGPU EP vs Kiln's WebGPU target
    .venv/bin/python -m bench.browser --repeat 30 --device-class gpu

On this machine WebGPU is SwiftShader (Vulkan on the CPU), so the default ``--device-class`` is
``cpu``; pass ``gpu`` in a browser with a real GPU. onnxruntime-web is installed from npm into
``bench/web/node_modules`` (pinned in ``bench/web/package.json``) on first use.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record

WEB = ROOT / "bench" / "web"
ORT_DIST = WEB / "node_modules" / "onnxruntime-web" / "dist"

#: the page: two functions the harness calls through Playwright, one per runtime
PAGE = """<!doctype html><meta charset="utf-8"><title>kiln vs onnxruntime-web</title>
<script type="module">
import * as kiln from './pkg/kiln.js';
import * as ort from './ort/ort.all.min.mjs';

ort.env.wasm.wasmPaths = new URL('./ort/', location.href).href;
ort.env.logLevel = 'error';

async function timed(runOnce, repeat, warmup) {
  let t0 = performance.now();
  const first = await runOnce();
  const cold = performance.now() - t0;
  for (let i = 0; i < warmup; i++) await runOnce();
  const times = [];
  for (let i = 0; i < repeat; i++) {
    t0 = performance.now();
    await runOnce();
    times.push(performance.now() - t0);
  }
  return {times, cold, output: Array.from(first)};
}

window.benchKiln = async (spec) => {
  const t0 = performance.now();
  const options = spec.target ? {target: spec.target} : {};
  const session = await kiln.load('./pkg/', options);
  const load = performance.now() - t0;
  const feeds = {[spec.input]: new kiln.Tensor('float32', new Float32Array(spec.data), spec.shape)};
  const r = await timed(async () => (await session.run(feeds))[spec.output].data, spec.repeat, spec.warmup);
  return {...r, load, target: session.target ?? 'webgpu'};
};

window.benchOrt = async (spec) => {
  ort.env.wasm.numThreads = spec.threads;
  const t0 = performance.now();
  const session = await ort.InferenceSession.create('./model.onnx', {executionProviders: [spec.ep]});
  const load = performance.now() - t0;
  const feeds = {[spec.input]: new ort.Tensor('float32', new Float32Array(spec.data), spec.shape)};
  const r = await timed(async () => (await session.run(feeds))[spec.output].data, spec.repeat, spec.warmup);
  await session.release();
  return {...r, load, target: spec.ep};
};
window.benchReady = true;
</script>
"""

#: contestant -> (runtime, options); "kiln-*" run the Kiln package, "ort-*" onnxruntime-web
CONTESTANTS = {
    "kiln-webgpu": ("kiln", {"target": "webgpu"}),
    "ort-webgpu": ("ort", {"ep": "webgpu", "threads": 1}),
    "kiln-wasm": ("kiln", {"target": "wasm"}),
    "ort-wasm": ("ort", {"ep": "wasm", "threads": 1}),
    "ort-wasm-mt": ("ort", {"ep": "wasm", "threads": 0}),
}


def ensure_onnxruntime_web(console: Console) -> Path:
    """Install onnxruntime-web from npm into ``bench/web`` unless it is there; returns its ``dist`` folder.

    Raises:
        RuntimeError: npm is missing or the install failed.
    """
    if not (ORT_DIST / "ort.all.min.mjs").exists():
        console.print("installing onnxruntime-web from npm (once) ...")
        try:
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=WEB, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"could not install onnxruntime-web with npm in {WEB}: {e}") from e
    return ORT_DIST


def serve_root(root: Path) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``root`` on a free loopback port (cross-origin isolated, so wasm threads are allowed)."""
    from kiln.runtime.serve import PackageRequestHandler, server_url

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(PackageRequestHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, name="bench-server", daemon=True).start()
    return server, server_url(server)


def main(argv: list[str] | None = None) -> dict:
    """Run the browser benchmark; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "mobilenet_v2_imagenet.onnx")
    ap.add_argument("--contestants", default="kiln-webgpu,ort-webgpu",
                    help=f"comma list of {', '.join(CONTESTANTS)}")
    ap.add_argument("--device-class", default="cpu", choices=["cpu", "gpu"],
                    help="Kiln's default schedules: cpu for SwiftShader (this machine), gpu for a real GPU")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    names = args.contestants.split(",")
    unknown = [n for n in names if n not in CONTESTANTS]
    if unknown:
        ap.error(f"unknown contestants {unknown}; known: {', '.join(CONTESTANTS)}")
    console = Console(width=140)

    import onnx
    import onnxruntime as ort
    from playwright.sync_api import sync_playwright

    import kiln
    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    model = onnx.load(str(args.model), load_external_data=False)
    inp, outp = model.graph.input[0], model.graph.output[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"]).run(None, {inp.name: x})[0]
    dist = ensure_onnxruntime_web(console)
    targets = sorted({CONTESTANTS[n][1]["target"] for n in names if CONTESTANTS[n][0] == "kiln"})
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        console.print(f"compiling {args.model.name} for {','.join(targets) or 'webgpu'} ({args.device_class}) ...")
        kiln.compile(args.model, root / "pkg", target=",".join(targets) if len(targets) > 1 else
                     (targets[0] if targets else "webgpu"), device_class=args.device_class)
        compile_s = time.perf_counter() - t0
        (root / "ort").symlink_to(dist, target_is_directory=True)
        (root / "model.onnx").symlink_to(args.model.resolve())
        (root / "index.html").write_text(PAGE)
        server, url = serve_root(root)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.on("console", lambda m: m.type == "error" and console.print(f"[red]page: {m.text}[/]"))
                page.goto(url + "index.html")
                page.wait_for_function("window.benchReady === true", timeout=60_000)
                base = {"input": inp.name, "output": outp.name, "shape": list(x.shape), "data": x.ravel().tolist(),
                        "repeat": args.repeat, "warmup": args.warmup}
                for name in names:
                    runtime, options = CONTESTANTS[name]
                    console.print(f"[bold]{name}[/] ...")
                    fn = "benchKiln" if runtime == "kiln" else "benchOrt"
                    try:
                        r = page.evaluate(f"(spec) => window.{fn}(spec)", {**base, **options})
                    except Exception as e:  # noqa: BLE001  (one failing contestant must not stop the run)
                        results[name] = {"error": str(e).splitlines()[0][:300]}
                        console.print(f"[red]{name}: {results[name]['error']}[/]")
                        continue
                    out = np.asarray(r.pop("output"), np.float32)
                    results[name] = {"median_ms": float(np.median(r["times"])), "min_ms": min(r["times"]), "cold_ms": r["cold"],
                                     "load_ms": r["load"], "times_ms": r["times"], "target": r["target"],
                                     "max_abs_error": float(np.abs(out - expected.ravel()).max())}
                user_agent = page.evaluate("navigator.userAgent")
                adapter = page.evaluate("""async () => { const a = await navigator.gpu?.requestAdapter();
                    return a ? `${a.info.vendor} ${a.info.architecture} ${a.info.description}`.trim() : 'none'; }""")
                browser.close()
        finally:
            server.shutdown()
            server.server_close()
    table = Table(title=f"{args.model.name} in one Chromium page, median ms of {args.repeat} runs after "
                        f"{args.warmup} warm-up (run() to outputs)")
    for col in ("contestant", "median ms", "min ms", "cold ms", "load ms", "max err", "kiln-webgpu / this"):
        table.add_column(col, justify="left" if col == "contestant" else "right")
    ref = results.get("kiln-webgpu", {}).get("median_ms")
    for name, r in results.items():
        if "error" in r:
            table.add_row(name, "error: " + r["error"][:70], "", "", "", "", "")
            continue
        ratio = f"{ref / r['median_ms']:.2f}" if ref else "-"
        table.add_row(name, f"{r['median_ms']:.1f}", f"{r['min_ms']:.1f}", f"{r['cold_ms']:.1f}", f"{r['load_ms']:.0f}",
                      f"{r['max_abs_error']:.1e}", ratio)
    console.print(table)
    console.print(f"adapter: {adapter}; {user_agent}")
    record = {"benchmark": "browser", "model": args.model.name, "repeat": args.repeat, "warmup": args.warmup,
              "device_class": args.device_class, "compile_s": compile_s, "adapter": adapter,
              "user_agent": user_agent, "results": results}
    if "kiln-webgpu" in results and "ort-webgpu" in results and "error" not in results["ort-webgpu"] and ref:
        record["kiln_over_ort_webgpu"] = ref / results["ort-webgpu"]["median_ms"]
    path = write_record(record, args.out, "browser")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
