"""Fit sin(x) on [-pi, pi] with an MLP 1 -> 128 -> 128 -> 1 (ReLU) trained by Adam, in Kiln's eager mode.

The TensorJS example, in Python: every op runs a WGSL kernel on WebGPU (wgpu-py; lavapipe on a
machine without a GPU). Prints the loss curve and the kernel cache statistics.

    python examples/fit_mlp.py [--steps 300] [--lr 0.01] [--batch 256] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import kiln
from kiln import nn, optim


def make_model() -> nn.Module:
    """The MLP 1 -> 128 -> 128 -> 1 with ReLU."""
    return nn.Sequential(nn.Linear(1, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))


def fit(steps: int = 300, lr: float = 1e-2, batch: int = 256, seed: int = 0, every: int = 25,
        log=print) -> list[tuple[int, float]]:
    """Train on ``batch`` fixed points of sin(x), x uniform in [-pi, pi]; returns ``(step, MSE)`` every ``every`` steps
    and after the last one."""
    kiln.manual_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-math.pi, math.pi, (batch, 1)).astype(np.float32)
    xs, ys = kiln.tensor(x), kiln.tensor(np.sin(x))
    model = make_model()
    opt = optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()
    curve = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()
        opt.step()
        if step % every == 0 or step == steps or step == 1:
            curve.append((step, loss.item()))  # the only readback of the step
            log(f"step {step:4d}  mse {curve[-1][1]:.6f}")
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    curve = fit(args.steps, args.lr, args.batch, args.seed)
    dt = time.perf_counter() - t0
    print(f"final mse {curve[-1][1]:.6f} after {args.steps} steps in {dt:.1f} s ({dt / args.steps * 1e3:.1f} ms/step)")
    print("kernel cache:", kiln.eager.stats())


if __name__ == "__main__":
    main()
