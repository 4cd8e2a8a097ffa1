"""Soak: many runs of one session, natively and in one Chromium page, with memory sampled (issue 19).

One package (MiniLM-L6 by default, compiled with its dims left to run time) runs ``--runs`` times per session,
cycling through input shapes (batch x seq) so every run changes the run-time dims: dispatch sizes, variants and,
on the first large shape, buffer growth. Every ``--sample`` runs it records:

- natively (Python, wgpu-py): the process's resident memory (``VmRSS``), the live wgpu objects and the bytes of
  GPU buffers and textures (``wgpu.diagnostics.object_counts``);
- in Chromium (kiln.js): the JS heap after a garbage collection (``performance.memory``, with
  ``--enable-precise-memory-info --js-flags=--expose-gc``) and the GPU buffers kiln.js holds (``createBuffer``
  minus ``destroy`` counted by the page), plus the wasm memory for the wasm target;

and checks the outputs of every shape against onnxruntime (CPU) within 1e-3 (``TOLERANCE``; in the page, the sum
of |y|). Memory is *flat* when, from the sample after 10 % of the runs (warm-up: buffers grow to the largest shape)
to the last, the resident memory or JS heap grows by less than 8 MiB and the GPU objects and bytes do not grow. Prints a table per session, writes
``soak-<date>.json`` and exits with 1 when a session is not flat or not correct::

    .venv/bin/python -m bench.soak                                      # 10,000 runs: webgpu natively and in Chromium
    .venv/bin/python -m bench.soak --native webgpu,wasm,cpu --browser webgpu,wasm --runs 2000
"""

from __future__ import annotations

import argparse
import base64
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.browser import serve_root
from bench.common import ROOT, write_record

MODEL = ROOT.parent / "shared" / "models" / "all_minilm_l6_v2.onnx"
#: the input shapes (batch, seq) the runs cycle through
SHAPES = [(1, 8), (2, 6), (1, 12), (3, 4), (1, 5)]
#: growth allowed from the warm-up sample to the last, in bytes of resident memory or JS heap
FLAT_BYTES = 8 << 20
#: the outputs' largest error against onnxruntime (natively: absolute; in the page: relative, of the sum of |y|)
TOLERANCE = 1e-3

#: the page: ``setup(target)`` loads the package, ``runMany(n, feeds)`` runs n times cycling through the feed sets and
#: samples memory; the GPU buffers are counted by wrapping createBuffer and destroy before kiln.js loads
PAGE = """<!doctype html><meta charset="utf-8"><title>kiln soak</title><link rel="icon" href="data:,">
<script type="module">
let live = 0, liveBytes = 0;
if (navigator.gpu) {
  const sizes = new WeakMap();
  const create = GPUDevice.prototype.createBuffer;
  GPUDevice.prototype.createBuffer = function (d) {
    const b = create.call(this, d); live += 1; liveBytes += d.size; sizes.set(b, d.size); return b; };
  const destroy = GPUBuffer.prototype.destroy;
  GPUBuffer.prototype.destroy = function () {
    if (sizes.has(this)) { live -= 1; liveBytes -= sizes.get(this); sizes.delete(this); }
    return destroy.call(this); };
}
const kiln = await import('./pkg/kiln.js');
let session, inputs;
const decode = (text) => new BigInt64Array(Uint8Array.from(atob(text), (c) => c.charCodeAt(0)).buffer);
window.setup = async (target, feedSets) => {
  session = await kiln.load('./pkg/', {target, threads: 1});
  inputs = feedSets.map((feeds) => Object.fromEntries(Object.entries(feeds).map(
    ([name, {dims, data}]) => [name, new kiln.Tensor('int64', decode(data), dims)])));
  return session.target;
};
window.runMany = async (n, start) => {
  const t0 = performance.now();
  const sums = {};
  for (let i = start; i < start + n; i++) {
    const k = i % inputs.length;
    const {last_hidden_state: h} = await session.run(inputs[k]);
    if (!(k in sums)) { let s = 0; for (const v of h.data) s += Math.abs(v); sums[k] = s; }
  }
  const ms = (performance.now() - t0) / n;
  if (window.gc) window.gc();
  return {ms, sums, heap: performance.memory ? performance.memory.usedJSHeapSize : null, buffers: live,
          bufferBytes: liveBytes, wasmBytes: session.backend.memory?.buffer?.byteLength ?? null};
};
window.soakReady = true;
</script>"""


def _rss() -> int:
    """The process's resident memory in bytes (Linux ``/proc``; elsewhere the peak, from ``getrusage``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _gpu_objects() -> tuple[int, int]:
    """(live wgpu objects, bytes of GPU buffers and textures) of this process."""
    import wgpu

    counts = wgpu.diagnostics.object_counts.get_dict()
    return counts["total"]["count"], counts["total"].get("resource_mem", 0)


def _feed_sets(rng) -> list[dict[str, np.ndarray]]:
    from tools.dynamic_minilm import feeds

    return [feeds(rng, b, s) for b, s in SHAPES]


def _verdict(samples: list[dict], keys: tuple[str, ...]) -> dict:
    """Growth of each key from the warm-up sample (after 10 % of the runs) to the last, and whether it is flat."""
    base = next(s for s in samples if s["run"] >= samples[-1]["run"] // 10)
    last = samples[-1]
    growth = {k: (last[k] - base[k]) if last.get(k) is not None and base.get(k) is not None else None for k in keys}
    flat = all(g is None or (g < FLAT_BYTES if k in ("rss_bytes", "heap_bytes", "wasm_bytes") else g <= 0)
               for k, g in growth.items())
    return {"from_run": base["run"], "growth": growth, "flat": flat}


def soak_native(pkg: Path, target: str, runs: int, every: int, feeds: list, refs: list, console: Console) -> dict:
    """``runs`` runs of one native session on ``target``, sampled every ``every`` runs."""
    import kiln

    session = kiln.load(pkg, target=target)
    samples, worst = [], 0.0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"native {target}", total=runs)
        t0 = time.perf_counter()
        for i in range(runs):
            out = session.run(feeds[i % len(feeds)])["last_hidden_state"]
            if i % every < len(feeds):  # (every shape once a window)
                worst = max(worst, float(np.abs(out - refs[i % len(feeds)]).max()))
            if (i + 1) % every == 0:
                objects, gpu_bytes = _gpu_objects()
                samples.append({"run": i + 1, "ms": (time.perf_counter() - t0) * 1e3 / every, "rss_bytes": _rss(),
                                "gpu_objects": objects, "gpu_bytes": gpu_bytes})
                t0 = time.perf_counter()
            progress.advance(task)
    return {"where": "native", "target": target, "runs": runs, "max_abs_error": worst, "correct": worst <= TOLERANCE,
            "samples": samples, **_verdict(samples, ("rss_bytes", "gpu_objects", "gpu_bytes"))}


def soak_browser(root: Path, targets: list[str], runs: int, every: int, feeds: list, refs: list,
                 console: Console) -> list[dict]:
    """``runs`` runs of one kiln.js session per target in one Chromium page each, sampled every ``every`` runs."""
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    wire = [{k: {"dims": list(v.shape), "data": base64.b64encode(v.tobytes()).decode()} for k, v in f.items()}
            for f in feeds]
    sums = [float(np.abs(r).sum()) for r in refs]
    (root / "index.html").write_text(PAGE)
    server, url = serve_root(root)
    results = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                        args=[*CHROMIUM_ARGS, "--enable-precise-memory-info", "--js-flags=--expose-gc"])
            for target in targets:
                page = browser.new_page()
                page.set_default_timeout(600_000)
                page.goto(url + "index.html")
                page.wait_for_function("window.soakReady === true", timeout=60_000)
                got = page.evaluate("([t, f]) => window.setup(t, f)", [target, wire])
                samples, worst = [], 0.0
                with Progress(console=console, transient=True) as progress:
                    task = progress.add_task(f"Chromium {got}", total=runs)
                    for start in range(0, runs, every):
                        r = page.evaluate("([n, s]) => window.runMany(n, s)", [every, start])
                        for k, s in r["sums"].items():  # (sums of |y|: a wrong output shows)
                            worst = max(worst, abs(s - sums[int(k)]) / max(sums[int(k)], 1.0))
                        samples.append({"run": start + every, "ms": r["ms"], "heap_bytes": r["heap"],
                                        "gpu_buffers": r["buffers"], "gpu_bytes": r["bufferBytes"],
                                        "wasm_bytes": r["wasmBytes"]})
                        progress.advance(task, every)
                page.close()
                results.append({"where": "chromium", "target": got, "runs": runs, "max_rel_sum_error": worst,
                                "correct": worst <= TOLERANCE, "samples": samples,
                                **_verdict(samples, ("heap_bytes", "gpu_buffers", "gpu_bytes", "wasm_bytes"))})
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return results


def _mib(v) -> str:
    return "-" if v is None else f"{v / 2**20:+.1f}"


def main(argv: list[str] | None = None) -> dict:
    """Run the soak; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--sample", type=int, default=500, help="runs between memory samples")
    ap.add_argument("--native", default="webgpu", help="comma list of native targets (webgpu, wasm, cpu), or ''")
    ap.add_argument("--browser", default="webgpu", help="comma list of kiln.js targets (webgpu, wasm), or ''")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    if args.runs < 2 * args.sample or args.sample < len(SHAPES):
        ap.error(f"--runs must be at least twice --sample, and --sample at least {len(SHAPES)}")
    console = Console(width=140)

    import onnxruntime as ort

    import kiln

    feeds = _feed_sets(np.random.default_rng(0))
    ref = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    refs = [ref.run(["last_hidden_state"], f)[0] for f in feeds]
    native = [t for t in args.native.split(",") if t]
    browser = [t for t in args.browser.split(",") if t]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        targets = sorted(set(native) | set(browser))
        console.print(f"compiling {args.model.name} for {','.join(targets)} (run-time dims) ...")
        pkg = kiln.compile(args.model, root / "pkg", target=",".join(targets), device_class="cpu")
        for target in native:
            results.append(soak_native(pkg, target, args.runs, args.sample, feeds, refs, console))
        if browser:
            results += soak_browser(root, browser, args.runs, args.sample, feeds, refs, console)
    table = Table(title=f"{args.model.name}: {args.runs} runs per session, shapes {SHAPES} in turn; growth from the "
                        "warm-up sample (10 % of the runs) to the last")
    for col in ("where", "target", "ms/run", "error", "memory MiB", "GPU objects", "GPU MiB", "wasm MiB", "flat",
                "correct"):
        table.add_column(col, justify="left" if col in ("where", "target") else "right")
    for r in results:
        g = r["growth"]
        memory = g.get("rss_bytes", g.get("heap_bytes"))
        objects = g.get("gpu_objects", g.get("gpu_buffers"))
        error = r.get("max_abs_error", r.get("max_rel_sum_error"))
        table.add_row(r["where"] + (" RSS" if "rss_bytes" in g else " JS heap"), r["target"],
                      f"{np.median([s['ms'] for s in r['samples']]):.2f}", f"{error:.1e}", _mib(memory),
                      "-" if objects is None else f"{objects:+d}", _mib(g.get("gpu_bytes")), _mib(g.get("wasm_bytes")),
                      "yes" if r["flat"] else "[red]NO[/]", "yes" if r["correct"] else "[red]NO[/]")
    console.print(table)
    record = {"benchmark": "soak", "model": args.model.name, "runs": args.runs, "sample_every": args.sample,
              "shapes": SHAPES, "flat_bytes": FLAT_BYTES, "results": results}
    path = write_record(record, args.out, "soak")
    console.print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if not all(r["flat"] and r["correct"] for r in results):
        raise SystemExit(1)
    return record


if __name__ == "__main__":
    main()
