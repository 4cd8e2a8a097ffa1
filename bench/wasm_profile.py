"""Where a wasm package's time goes in Chromium: each kernel of its plan timed alone, one thread.

    .venv/bin/python -m bench.wasm_profile PKG [PKG ...] [--dim NAME=SIZE ...] [--repeat 5] [--top 15]
    .venv/bin/python -m bench.wasm_profile /tmp/whisper/encoder
    .venv/bin/python -m bench.wasm_profile /tmp/whisper/decoder --dim sequence=1 --dim past_sequence=100

``PKG`` is a package folder with a ``targets.wasm`` section (``kiln compile ... --target wasm``; a speech package's
``encoder`` and ``decoder`` folders). The page runs kiln.js's single-threaded wasm backend on its own thread (no
worker), binds the run-time dims (each at its ``opt`` value unless ``--dim`` names it), and calls every plan step
``--warmup + --repeat`` times in order, timing each call with ``performance.now()``. Memory holds zeros, not the
weights (every page written, so that reads miss the caches as weights would): a kernel's time does not depend on
its values, except through gathers and data-dependent dims, which therefore read index 0. Several packages are measured alternately in one page, twice, and each step keeps its
fastest median, so that variants of one model compare on equal terms (V8 first runs a module's functions as
Liftoff's baseline code and swaps in TurboFan's as they get hot; the second round runs the latter).

Prints, for each package, the plan's total and the kernels ranked by their summed time (calls, ms, share, the
kernel's operator count and schedule), and writes JSON (``wasm-profile-<date>.json``): every step's time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record

#: the page: ``profile(folder, dims, warmup, repeat)`` -> one row per plan step [kernel, ms]
PAGE = """<!doctype html><meta charset="utf-8"><title>kiln wasm profile</title><link rel="icon" href="data:,">
<script type="module">
import {WasmBackend} from './p0/wasm.js';

const modules = {};  // one module a folder, so that the second round runs the code V8 tiered up in the first

window.profile = async (folder, dims, warmup, repeat) => {
  const manifest = await (await fetch(folder + '/manifest.json')).json();
  modules[folder] ??= await WebAssembly.compileStreaming(fetch(folder + '/' + manifest.targets.wasm.module));
  const module = modules[folder];
  const backend = await WasmBackend.single(module, manifest);
  const bound = Object.fromEntries((manifest.dynamic_dims ?? []).map((d) => [d.name, dims[d.name] ?? d.opt]));
  if (manifest.dynamic_dims?.length) backend.setDims(bound);
  new Uint8Array(backend.memory.buffer, manifest.targets.wasm.memory.arena).fill(0);  // no page left unwritten
  const times = backend.calls.map(() => []);
  for (let r = 0; r < warmup + repeat; r++) {
    for (let i = 0; i < backend.calls.length; i++) {
      const t0 = performance.now();
      backend.calls[i]();
      if (r >= warmup) times[i].push(performance.now() - t0);
    }
  }
  const median = (a) => a.slice().sort((x, y) => x - y)[a.length >> 1];
  return manifest.targets.wasm.plan.map((step, i) => [backend.kernels[i], median(times[i])]);
};
window.benchReady = true;
</script>
"""


def _schedule(s: dict) -> str:
    """A kernel's schedule in short: its splits (axis x factor, ``s`` strided), unroll and reduce lanes."""
    splits = " ".join(f"{x['axis']}x{x['factor']}{'' if x.get('contiguous', True) else 's'}" for x in s.get("splits", []))
    extra = "".join(f" {k} {s[k]}" for k in ("simd_reduce", "reduce_lanes") if s.get(k, 1) > 1)
    return f"split {splits or '-'} unroll {s.get('unroll', 1)}{extra}"


def main(argv: list[str] | None = None) -> dict:
    """Profile the packages; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packages", type=Path, nargs="+", help="package folders with a wasm target")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="bind a run-time dim")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=15, help="kernels listed per package")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    dims = {}
    for d in args.dim:
        name, _, size = d.partition("=")
        if not size.isdigit():
            ap.error(f"--dim {d}: expected NAME=SIZE with a whole number")
        dims[name] = int(size)
    manifests = []
    for p in args.packages:
        if not (p / "manifest.json").is_file():
            ap.error(f"{p}: no manifest.json (a package folder, e.g. a speech package's encoder)")
        m = json.loads((p / "manifest.json").read_text())
        if "wasm" not in m.get("targets", {}):
            ap.error(f"{p}: the package has no wasm target (kiln compile --target wasm)")
        manifests.append(m)
    known = {d["name"] for m in manifests for d in m.get("dynamic_dims", [])}
    for name in dims:
        if name not in known:
            ap.error(f"--dim {name}: no package has a run-time dim of that name (they have: "
                     f"{', '.join(sorted(known)) or 'none'})")

    from bench.browser import bench_page

    console = Console(width=120)
    rounds: list[list[list]] = [[] for _ in args.packages]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, p in enumerate(args.packages):
            (root / f"p{i}").symlink_to(p.resolve(), target_is_directory=True)
        (root / "index.html").write_text(PAGE)
        with bench_page(root, timeout_ms=900_000) as page:
            for _ in range(2):
                for i, p in enumerate(args.packages):
                    console.print(f"profiling {p} ...")
                    rounds[i].append(page.evaluate("(a) => window.profile(...a)",
                                                   [f"./p{i}", dims, args.warmup, args.repeat]))
            user_agent = page.evaluate("navigator.userAgent")
    record: dict = {"benchmark": "wasm-profile", "dims": dims, "repeat": args.repeat, "warmup": args.warmup,
                    "user_agent": user_agent, "packages": {}}
    for p, m, runs in zip(args.packages, manifests, rounds, strict=True):
        kernels = m["targets"]["wasm"]["kernels"]
        steps = [(runs[0][s][0], min(r[s][1] for r in runs)) for s in range(len(runs[0]))]
        total = sum(ms for _, ms in steps)
        by_kernel: dict[int, list[float]] = {}
        for k, ms in steps:
            by_kernel.setdefault(k, []).append(ms)
        table = Table(title=f"{p}: {total:.1f} ms a run, {len(steps)} calls (median of {args.repeat}, the faster of "
                            "2 rounds)")
        for col in ("kernel", "calls", "ms", "share", "schedule"):
            table.add_column(col, justify="left" if col in ("kernel", "schedule") else "right")
        ranked = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))
        for k, times in ranked[:args.top]:
            table.add_row(kernels[k]["name"], str(len(times)), f"{sum(times):.2f}", f"{sum(times) / total:.0%}",
                          _schedule(kernels[k].get("schedule", {})))
        console.print(table)
        record["packages"][str(p)] = {"total_ms": total, "steps": [{"kernel": kernels[k]["name"], "ms": ms}
                                                                   for k, ms in steps]}
    console.print(user_agent)
    path = write_record(record, args.out, "wasm-profile")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
