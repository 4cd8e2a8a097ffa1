"""Kiln's wasm target against onnxruntime-web's wasm backend in one headless Chromium page.

Usage::

    python -m bench.browser_wasm [--model models/mobilenet_v2_imagenet.onnx] [--repeat 20] [--warmup 5]
                                 [--threads 2] [--out bench/results]

Compiles the model for the ``wasm`` target, installs onnxruntime-web from npm into
``bench/browser/node_modules`` when it is missing (``npm install``, versions in
``bench/browser/package.json``), serves the package, the model, onnxruntime-web's ``dist`` and
``bench/browser/wasm.html`` from a loopback server that sends COOP/COEP (so the page is
cross-origin isolated and onnxruntime-web may use threads), and drives Debian's Chromium through
Playwright. The page runs Kiln single-threaded straight from the manifest (the documented ABI, no
kiln.js) and onnxruntime-web's wasm execution provider (SIMD) on the same random input, checks
they agree, and times both interleaved. It is loaded once with onnxruntime-web on 1 thread (the
acceptance comparison: Kiln / onnxruntime-web <= 1.25) and, with ``--threads N`` > 1, again with N
threads for onnxruntime-web (Kiln stays single-threaded here). Prints a table and writes JSON
(``browser-wasm-<model>-<date>.json``).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record

BROWSER_DIR = ROOT / "bench" / "browser"
CHROMIUM = "/usr/bin/chromium"


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files with the headers that make a page cross-origin isolated (SharedArrayBuffer, threads)."""

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args) -> None:  # quiet
        pass


def ensure_onnxruntime_web(console: Console) -> Path:
    """``bench/browser/node_modules/onnxruntime-web/dist``, running ``npm install`` there first if needed."""
    dist = BROWSER_DIR / "node_modules" / "onnxruntime-web" / "dist"
    if not dist.exists():
        if shutil.which("npm") is None:
            raise SystemExit("npm is needed to install onnxruntime-web (Debian: apt-get install npm)")
        console.print("installing onnxruntime-web with npm into bench/browser/node_modules ...")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=BROWSER_DIR, check=True)
    return dist


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    from playwright.sync_api import sync_playwright

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "mobilenet_v2_imagenet.onnx")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="also run onnxruntime-web with this many threads")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console()
    dist = ensure_onnxruntime_web(console)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kiln.compile(args.model, root / "pkg", target="wasm", wasm_threads=False)
        shutil.copyfile(args.model, root / "model.onnx")
        shutil.copytree(dist, root / "ort")
        shutil.copyfile(BROWSER_DIR / "wasm.html", root / "index.html")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                            args=["--no-sandbox", "--disable-background-networking"])
                try:
                    for n in sorted({1, args.threads}):
                        page = browser.new_page()
                        page.set_default_timeout(600_000)
                        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html?threads={n}")
                        page.wait_for_function("typeof window.benchmark === 'function'")
                        with console.status(f"timing in Chromium (onnxruntime-web {n} thread(s)) ..."):
                            runs[n] = page.evaluate("([r, w]) => window.benchmark(r, w)", [args.repeat, args.warmup])
                        page.close()
                finally:
                    browser.close()
        finally:
            server.shutdown()
            server.server_close()
    table = Table(title=f"{args.model.name} in headless Chromium: median of {args.repeat} runs after {args.warmup} "
                        "warm-up (interleaved)")
    for col in ("contestant", "threads", "median ms", "min ms", "max ms", "first run ms"):
        table.add_column(col, justify="left" if col == "contestant" else "right")
    rows = {}
    for n, r in runs.items():
        if n == 1:
            rows["kiln-wasm"] = r["kiln"]
        rows[f"onnxruntime-web-wasm {n}t"] = r["ort"]
    for name, r in rows.items():
        table.add_row(name, str(r["threads"]), f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                      f"{r['cold_ms']:.2f}")
    console.print(table)
    ratio = runs[1]["kiln"]["median_ms"] / runs[1]["ort"]["median_ms"]
    err = max(r["max_abs_error"] for r in runs.values())
    console.print(f"kiln-wasm / onnxruntime-web-wasm (1 thread) = {ratio:.2f}x (goal <= 1.25); max abs error "
                  f"{err:.2e}; cross-origin isolated: {runs[1]['cross_origin_isolated']}")
    record = {"benchmark": "browser-wasm", "model": args.model.name, "repeat": args.repeat, "warmup": args.warmup,
              "results": rows, "ratio_kiln_over_ort_web_1t": ratio, "max_abs_error": err,
              "user_agent": runs[1]["user_agent"],
              "versions": {"kiln": kiln.__version__, "onnxruntime-web": _ort_web_version(dist)}}
    path = write_record(record, args.out, f"browser-wasm-{args.model.stem}")
    console.print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return record


def _ort_web_version(dist: Path) -> str:
    import json

    return json.loads((dist.parent / "package.json").read_text())["version"]


if __name__ == "__main__":
    main()
