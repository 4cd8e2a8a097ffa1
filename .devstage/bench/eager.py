"""Eager-mode benchmarks: a training step of the TensorJS MLP, and shape-generic against specialised kernels.

    python -m bench.eager [--batch 256] [--repeat 20] [--torch-device cpu|cuda] [--out DIR]

- ``train step``: one Adam step of examples/fit_mlp.py's MLP (1 -> 128 -> 128 -> 1, ReLU, MSE) on
  ``--batch`` points, the loss read back every step (so the step is complete when the clock stops).
  The peer is PyTorch (float32, eager) on ``--torch-device``, same model, optimizer and data.
- ``elementwise``: ``x * y + 1`` chains on ``--size`` elements, per op, run by the shape-generic kernel
  (shapes from uniforms) and by the specialised kernel (shapes baked in), synchronised by one readback
  per sample of ``--chain`` ops.

Medians of ``--repeat`` samples after warm-up (the first, cold sample, compiles the kernels, and is
reported separately). Prints a table and writes JSON (``eager-<date>.json``) under ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, summary, time_runs, write_record

# Triton's LLVM segfaults next to Mesa's lavapipe (see tests/eager_ref.py); eager PyTorch does not need it
sys.modules.setdefault("triton", None)


def _fit_mlp():
    spec = importlib.util.spec_from_file_location("fit_mlp", ROOT / "examples" / "fit_mlp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_train_step(batch: int, repeat: int, warmup: int, torch_device: str | None) -> list[dict]:
    """ms per Adam step of the MLP, Kiln eager and PyTorch."""
    import kiln
    from kiln import nn, optim

    rng = np.random.default_rng(0)
    x = rng.uniform(-np.pi, np.pi, (batch, 1)).astype(np.float32)
    y = np.sin(x)
    model = _fit_mlp().make_model()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    kx, ky = kiln.tensor(x), kiln.tensor(y)
    before = kiln.eager.stats()["dispatches"]

    def kiln_step():
        opt.zero_grad()
        loss = nn.MSELoss()(model(kx), ky)
        loss.backward()
        opt.step()
        return loss.item()

    kiln_step()
    per_step = kiln.eager.stats()["dispatches"] - before
    cold, times = time_runs(kiln_step, repeat, warmup)
    rows = [{"case": f"train step, batch {batch}", "runner": "kiln eager", "dispatches": per_step,
             **summary(times, cold)}]
    if torch_device:
        import torch

        dev = torch.device(torch_device)
        tm = torch.nn.Sequential(torch.nn.Linear(1, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                 torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(dev)
        topt = torch.optim.Adam(tm.parameters(), lr=1e-2)
        tx, ty = torch.tensor(x, device=dev), torch.tensor(y, device=dev)

        def torch_step():
            topt.zero_grad()
            loss = torch.nn.functional.mse_loss(tm(tx), ty)
            loss.backward()
            topt.step()
            return loss.item()

        cold, times = time_runs(torch_step, repeat, warmup)
        rows.append({"case": f"train step, batch {batch}", "runner": f"torch {torch_device}", **summary(times, cold)})
    return rows


def bench_elementwise(size: int, chain: int, repeat: int, warmup: int) -> list[dict]:
    """ms per elementwise op, generic and specialised kernels."""
    import kiln
    from kiln.eager import kernels

    rng = np.random.default_rng(1)
    a = kiln.tensor(rng.standard_normal(size).astype(np.float32))
    b = kiln.tensor(rng.standard_normal(size).astype(np.float32))
    rows = []
    for kind, after in (("shape-generic", 10**9), ("specialised", 0)):
        old = kernels.set_specialize_after(after)
        try:
            def run():
                z = a
                for _ in range(chain):
                    z = z * b + 1.0
                z.numpy()

            cold, times = time_runs(run, repeat, warmup)
        finally:
            kernels.set_specialize_after(old)
        s = summary([t / (2 * chain) for t in times], cold / (2 * chain))
        rows.append({"case": f"x * y + 1, {size} elements (per op)", "runner": f"kiln {kind}", **s})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description="Kiln eager-mode benchmarks")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--chain", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--torch-device", default="cpu", help="PyTorch device of the peer ('none' to skip)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    torch_device = None if args.torch_device == "none" else args.torch_device
    if torch_device and importlib.util.find_spec("torch") is None:
        torch_device = None
    rows = bench_train_step(args.batch, args.repeat, args.warmup, torch_device)
    rows += bench_elementwise(args.size, args.chain, args.repeat, args.warmup)
    import kiln

    adapter = kiln.eager.device.runtime().device.adapter.info
    table = Table(title=f"Kiln eager on {adapter.get('device', '?')}")
    for col in ("case", "runner", "median ms", "min ms", "cold ms", "vs first runner"):
        table.add_column(col)
    base: dict[str, float] = {}
    for r in rows:
        base.setdefault(r["case"], r["median_ms"])
        table.add_row(r["case"], r["runner"], f"{r['median_ms']:.3f}", f"{r['min_ms']:.3f}", f"{r['cold_ms']:.1f}",
                      f"{r['median_ms'] / base[r['case']]:.2f}x")
    Console(width=140).print(table)
    path = write_record({"bench": "eager", "adapter": dict(adapter), "rows": rows, "stats": kiln.eager.stats()},
                        args.out, "eager")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
