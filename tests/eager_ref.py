"""Comparison helper of the eager tests: Kiln's float32 results against PyTorch's float64 ones."""

from __future__ import annotations

import sys

import numpy as np
import torch

# PyTorch's CPU wheels import Triton lazily (torch.optim's first use pulls in torch._dynamo, which
# probes for it); Triton's bundled LLVM segfaults when Mesa's lavapipe (LLVM 15) is already loaded
# in the process. The tests use PyTorch on the CPU only, so make Triton unimportable.
sys.modules.setdefault("triton", None)

RTOL = 1e-4


def close(got: np.ndarray, want, what: str = "", scale: float | None = None) -> None:
    """``got`` (float32) within 1e-4 relative of ``want`` (float64), elementwise.

    Entries that cancel to nearly 0 get an absolute floor of 1e-5 times ``scale``: by default
    ``want``'s largest magnitude; pass the magnitude of the terms summed when the whole tensor
    cancels (a convolution bias followed by batch normalisation has an exactly zero gradient).
    """
    want = np.asarray(want.detach().numpy() if isinstance(want, torch.Tensor) else want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if scale is None:
        scale = float(np.abs(want).max()) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-5 * max(scale, 1e-3), err_msg=what)
