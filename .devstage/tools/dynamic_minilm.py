"""The acceptance grid of run-time dims: all-MiniLM-L6-v2 from ONE package against onnxruntime.

Usage (from the repository root)::

    python -m tools.dynamic_minilm                      # batch 1-4 x seq 1, 7, 128, 512; exit 1 if any fails
    python -m tools.dynamic_minilm --batch 1 2 --seq 1 7 --package build/minilm-dyn

Compiles ``all_minilm_l6_v2.onnx`` once with ``--dim batch=1..4 --dim seq=1..512@128`` (``--device-class cpu``)
unless ``--package`` names an existing package, then runs every (batch, seq) pair natively (wgpu-py) on fresh
random token ids with a padded last sequence, and prints the max abs error of ``last_hidden_state`` against
onnxruntime (CPU) and the run time. The criterion is max abs error <= 1e-4 (issue 3). Writes the table as JSON
with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT.parent / "shared" / "models" / "all_minilm_l6_v2.onnx"
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


def feeds(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Token ids in [1000, 30000) framed by [CLS]/[SEP], the last sequence half padded (attention mask 0)."""
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones((batch, seq), np.int64)
    if seq > 2:
        mask[-1, seq // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((batch, seq), np.int64)}


def main(argv: list[str] | None = None) -> int:
    """Run the grid; returns the exit status (0: every pair within tolerance)."""
    import onnxruntime as ort
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--package", type=Path, default=ROOT / "build" / "minilm-dynamic")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--seq", type=int, nargs="+", default=[1, 7, 128, 512])
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    console = Console()
    if not (args.package / "manifest.json").exists():
        t0 = time.perf_counter()
        kiln.compile(args.model, args.package, dims={"batch": (1, 4), "seq": (1, 512, 128)}, device_class="cpu",
                     progress=True)
        console.print(f"compiled {args.package} in {time.perf_counter() - t0:.1f} s")
    session = kiln.load(args.package)
    ref = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    rows = []
    pairs = [(b, s) for b in args.batch for s in args.seq]
    for b, s in track(pairs, description="running the grid", console=console, transient=True):
        f = feeds(rng, b, s)
        t0 = time.perf_counter()
        got = session.run(f)["last_hidden_state"]
        ms = (time.perf_counter() - t0) * 1e3
        want = ref.run(["last_hidden_state"], f)[0]
        err = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
        rows.append({"batch": b, "seq": s, "shape": list(got.shape), "max_abs_error": err, "ms": ms,
                     "ok": err <= args.tolerance})
    table = Table(title=f"MiniLM last_hidden_state from one package ({args.package}) vs onnxruntime")
    for col in ("batch", "seq", "shape", "max abs error", "ms (one run; the first also makes pipelines)", "ok"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), str(r["seq"]), str(r["shape"]), f"{r['max_abs_error']:.2e}", f"{r['ms']:.0f}",
                      "yes" if r["ok"] else "NO")
    console.print(table)
    ok = all(r["ok"] for r in rows)
    console.print(f"{sum(r['ok'] for r in rows)}/{len(rows)} within {args.tolerance:g}")
    if args.json:
        args.json.write_text(json.dumps({"package": str(args.package), "tolerance": args.tolerance, "runs": rows},
                                        indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
