"""Kiln against onnxruntime-web in one page of headless Chromium, on every browser target.

Both runtimes load the same ONNX model in the same page and run the same input. Each run is timed
in the page from ``run()`` to its outputs on the CPU (upload, compute and readback, as a web page
sees it); the contestants run interleaved (one run of each per round), so that a busy machine slows
them alike. Outputs are checked against onnxruntime CPU in Python. Prints a table with each
contestant's ratio to its onnxruntime-web peer on the same target and writes JSON
(``browser-<date>.json``)::

    .venv/bin/python -m bench.browser                                   # WebGPU: Kiln vs onnxruntime-web's webgpu EP
    .venv/bin/python -m bench.browser --contestants kiln-wasm,ort-wasm,kiln-wasm-mt,ort-wasm-mt
    .venv/bin/python -m bench.browser --contestants kiln-webgpu,kiln-webgl2,kiln-wasm --repeat 5

Contestants: ``kiln-webgpu``, ``kiln-webgl2``, ``kiln-wasm`` (one thread), ``kiln-wasm-mt`` (Web Workers,
one per core), ``ort-webgpu``, ``ort-wasm`` (one thread) and ``ort-wasm-mt`` (threads, one per core).
The page is cross-origin isolated (COOP/COEP), so both runtimes may use threads. On this machine
WebGPU and WebGL2 are SwiftShader (on the CPU), so the default ``--device-class`` is ``cpu``; pass
``gpu`` in a browser with a real GPU. onnxruntime-web is installed from npm into
``bench/web/node_modules`` (pinned in ``bench/web/package.json``) on first use.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.common import ROOT, write_record

WEB = ROOT / "bench" / "web"
ORT_DIST = WEB / "node_modules" / "onnxruntime-web" / "dist"

#: the page: sessions made by ``setup(name, spec)``, run once by ``runOnce(name)`` (returns ms)
PAGE = """<!doctype html><meta charset="utf-8"><title>kiln vs onnxruntime-web</title><link rel="icon" href="data:,">
<script type="module">
import * as kiln from './pkg/kiln.js';
import * as ort from './ort/ort.all.min.mjs';

ort.env.wasm.wasmPaths = new URL('./ort/', location.href).href;
ort.env.logLevel = 'error';
const sessions = {};

window.setup = async (name, spec) => {
  const t0 = performance.now();
  let run, target;
  if (spec.runtime === 'kiln') {
    const options = {target: spec.target};
    if (spec.threads) options.threads = spec.threads;
    const session = await kiln.load('./pkg/', options);
    const feeds = {[spec.input]: new kiln.Tensor('float32', new Float32Array(spec.data), spec.shape)};
    run = async () => (await session.run(feeds))[spec.output].data;
    target = session.target;
  } else {
    ort.env.wasm.numThreads = spec.threads;  // read when the first session is made: ort-wasm-mt needs its own page
    const session = await ort.InferenceSession.create('./model.onnx', {executionProviders: [spec.ep]});
    const feeds = {[spec.input]: new ort.Tensor('float32', new Float32Array(spec.data), spec.shape)};
    run = async () => (await session.run(feeds))[spec.output].data;
    target = spec.ep;
  }
  const load = performance.now() - t0;
  const t1 = performance.now();
  const output = Array.from(await run());
  sessions[name] = run;
  return {load, cold: performance.now() - t1, output, target};
};

window.runOnce = async (name) => {
  const t0 = performance.now();
  await sessions[name]();
  return performance.now() - t0;
};
window.benchReady = true;
</script>
"""

#: contestant -> (runtime, options, peer); Kiln contestants compare with the onnxruntime-web peer on their target
CONTESTANTS = {
    "kiln-webgpu": ("kiln", {"target": "webgpu"}, "ort-webgpu"),
    "kiln-webgl2": ("kiln", {"target": "webgl2"}, None),
    "kiln-wasm": ("kiln", {"target": "wasm", "threads": 1}, "ort-wasm"),
    "kiln-wasm-mt": ("kiln", {"target": "wasm"}, "ort-wasm-mt"),
    "ort-webgpu": ("ort", {"ep": "webgpu", "threads": 1}, None),
    "ort-wasm": ("ort", {"ep": "wasm", "threads": 1}, None),
    "ort-wasm-mt": ("ort", {"ep": "wasm", "threads": 0}, None),
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


@contextlib.contextmanager
def bench_page(root: Path, timeout_ms: int = 600_000, on_error: Callable[[str], None] | None = None) -> Iterator:
    """Serve ``root`` (:func:`serve_root`), open its ``index.html`` in headless Chromium (tests/browser.py's flags)
    and wait for the page's ``window.benchReady``; yields the Playwright page, whose calls time out after
    ``timeout_ms``. ``on_error`` gets the text of each console error. The browser and server stop on exit."""
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    server, url = serve_root(root)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.set_default_timeout(timeout_ms)
                if on_error is not None:
                    page.on("console", lambda m: m.type == "error" and on_error(m.text))
                page.goto(url + "index.html")
                page.wait_for_function("window.benchReady === true", timeout=60_000)
                yield page
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> dict:
    """Run the browser benchmark; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "mobilenet_v2_imagenet.onnx")
    ap.add_argument("--contestants", default="kiln-webgpu,ort-webgpu", help=f"comma list of {', '.join(CONTESTANTS)}")
    ap.add_argument("--device-class", default="cpu", choices=["cpu", "gpu"],
                    help="Kiln's default WebGPU schedules: cpu for SwiftShader (this machine), gpu for a real GPU")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    names = args.contestants.split(",")
    unknown = [n for n in names if n not in CONTESTANTS]
    if unknown:
        ap.error(f"unknown contestants {unknown}; known: {', '.join(CONTESTANTS)}")
    if len({CONTESTANTS[n][1]["threads"] for n in names if CONTESTANTS[n][0] == "ort"}) > 1:
        ap.error("ort-wasm-mt needs a run without the other ort contestants: onnxruntime-web fixes its thread "
                 "count when a page makes its first session")
    console = Console(width=140)

    import onnx
    import onnxruntime as ort

    import kiln

    model = onnx.load(str(args.model), load_external_data=False)
    inp, outp = model.graph.input[0], model.graph.output[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"]).run(None, {inp.name: x})[0]
    dist = ensure_onnxruntime_web(console)
    targets = [t for t in ("webgpu", "webgl2", "wasm")
               if any(CONTESTANTS[n][0] == "kiln" and CONTESTANTS[n][1]["target"] == t for n in names)] or ["webgpu"]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        console.print(f"compiling {args.model.name} for {','.join(targets)} (WebGPU schedules: {args.device_class}) ...")
        kiln.compile(args.model, root / "pkg", target=",".join(targets), device_class=args.device_class)
        compile_s = time.perf_counter() - t0
        (root / "ort").symlink_to(dist, target_is_directory=True)
        (root / "model.onnx").symlink_to(args.model.resolve())
        (root / "index.html").write_text(PAGE)
        with bench_page(root, on_error=lambda text: console.print(f"[red]page: {text}[/]")) as page:
            base = {"input": inp.name, "output": outp.name, "shape": list(x.shape), "data": x.ravel().tolist()}
            ready = []
            for name in names:
                runtime, options, _ = CONTESTANTS[name]
                console.print(f"loading [bold]{name}[/] ...")
                try:
                    r = page.evaluate("([name, spec]) => window.setup(name, spec)",
                                      [name, {**base, "runtime": runtime, **options}])
                except Exception as e:  # noqa: BLE001  (one failing contestant must not stop the run)
                    results[name] = {"error": str(e).splitlines()[0][:300]}
                    console.print(f"[red]{name}: {results[name]['error']}[/]")
                    continue
                out = np.asarray(r["output"], np.float32)
                results[name] = {"load_ms": r["load"], "cold_ms": r["cold"], "target": r["target"],
                                 "max_abs_error": float(np.abs(out - expected.ravel()).max()), "times_ms": []}
                ready.append(name)
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("interleaved runs", total=(args.warmup + args.repeat) * len(ready))
                for round_ in range(args.warmup + args.repeat):
                    for name in ready:
                        ms = page.evaluate("(name) => window.runOnce(name)", name)
                        if round_ >= args.warmup:
                            results[name]["times_ms"].append(ms)
                        progress.advance(task)
            for name in ready:
                times = results[name]["times_ms"]
                results[name].update(median_ms=float(np.median(times)), min_ms=float(min(times)))
            user_agent = page.evaluate("navigator.userAgent")
            adapter = page.evaluate("""async () => { const a = await navigator.gpu?.requestAdapter();
                return a ? `${a.info.vendor} ${a.info.architecture} ${a.info.description}`.trim() : 'none'; }""")
            cores = page.evaluate("navigator.hardwareConcurrency")
    table = Table(title=f"{args.model.name} in one Chromium page, median ms of {args.repeat} interleaved runs after "
                        f"{args.warmup} warm-up (run() to outputs)")
    for col in ("contestant", "target", "median ms", "min ms", "first run ms", "load ms", "max err", "kiln / peer"):
        table.add_column(col, justify="left" if col in ("contestant", "target") else "right")
    ratios = {}
    for name, r in results.items():
        if "error" in r:
            table.add_row(name, "", "error: " + r["error"][:70], "", "", "", "", "")
            continue
        peer = CONTESTANTS[name][2]
        ratio = "-"
        if peer and "median_ms" in results.get(peer, {}):
            ratios[f"{name}/{peer}"] = r["median_ms"] / results[peer]["median_ms"]
            ratio = f"{ratios[f'{name}/{peer}']:.2f}"
        table.add_row(name, r["target"], f"{r['median_ms']:.1f}", f"{r['min_ms']:.1f}", f"{r['cold_ms']:.1f}",
                      f"{r['load_ms']:.0f}", f"{r['max_abs_error']:.1e}", ratio)
    console.print(table)
    console.print(f"adapter: {adapter}; {cores} cores; {user_agent}")
    record = {"benchmark": "browser", "model": args.model.name, "repeat": args.repeat, "warmup": args.warmup,
              "device_class": args.device_class, "compile_s": compile_s, "adapter": adapter, "cores": cores,
              "user_agent": user_agent, "ratios": ratios, "results": results}
    path = write_record(record, args.out, "browser")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
