"""Linear-algebra and cache-update ONNX operators: Det, TensorScatter."""

from __future__ import annotations

import itertools

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import norm_axis
from kiln.frontend.onnx.ops.nn import _reshape
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value

#: largest matrix Det expands (Leibniz: n! products of n factors)
DET_MAX = 5


def _perm_sign(p: tuple[int, ...]) -> int:
    sign, seen = 1, list(p)
    for i in range(len(seen)):
        while seen[i] != i:
            j = seen[i]
            seen[i], seen[j] = seen[j], seen[i]
            sign = -sign
    return sign


@onnx_op("Det", since=11)
def det(b: Builder, x: Value) -> Value:
    """ONNX Det-11/22: determinants of the trailing ``[n, n]`` matrices by the Leibniz formula, one Gather of the
    ``n!`` permutations' entries, a product and a signed sum (float32; for ``n <= 5``).

    Raises:
        ShapeError: the trailing dims are not square. KilnError: ``n`` is above :data:`DET_MAX`.
    """
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"Det: input {list(x.shape)} does not end in square matrices")
    n = x.shape[-1]
    if n > DET_MAX:
        raise KilnError(f"Det: {n}x{n} matrices are not supported (at most {DET_MAX}x{DET_MAX})")
    lead = x.shape[:-2]
    perms = list(itertools.permutations(range(n)))
    idx = np.array([[i * n + p[i] for i in range(n)] for p in perms], np.int64)
    signs = np.array([_perm_sign(p) for p in perms], np.float32)
    flat = _reshape(b, x, (*lead, n * n))
    terms = b.op("ReduceProd", [b.op("Gather", [flat, b.const(idx)], axis=len(lead))], axes=(len(lead) + 1,),
                 keepdims=0)
    return b.op("ReduceSum", [b.op("Mul", [terms, b.const(signs, dtype=x.dtype)])], axes=(len(lead),), keepdims=0)


@onnx_op("TensorScatter", since=24)
def tensor_scatter(b: Builder, past: Value, update: Value, write_indices: Value | None = None, *, axis: int = -2,
                   mode: str = "linear") -> Value:
    """ONNX TensorScatter-24: ``past`` with ``update`` written along ``axis`` from position ``write_indices[b]``
    of each batch entry (0 when omitted; wrapping around in ``circular`` mode): a ScatterElements whose indices
    are computed at run time.

    Raises:
        ShapeError: ``update`` does not fit ``past``. KilnError: an unknown ``mode``.
    """
    if mode not in ("linear", "circular"):
        raise KilnError(f"TensorScatter: unknown mode {mode!r}")
    rank = len(past.shape)
    ax = norm_axis(axis, rank)
    if ax == 0 or len(update.shape) != rank or any(
            u != p for i, (u, p) in enumerate(zip(update.shape, past.shape)) if i != ax) or update.shape[ax] > past.shape[ax]:
        raise ShapeError(f"TensorScatter: update {list(update.shape)} does not fit cache {list(past.shape)} "
                         f"along axis {ax}")
    batch = past.shape[0]
    if write_indices is None:
        start = b.const(np.zeros((batch,) + (1,) * (rank - 1), np.int64))
    else:
        wi = write_indices if write_indices.dtype == "int64" else b.op("Cast", [write_indices], to="int64")
        start = _reshape(b, wi, (batch,) + (1,) * (rank - 1))
    steps = np.arange(update.shape[ax], dtype=np.int64).reshape([update.shape[ax] if d == ax else 1
                                                                 for d in range(rank)])
    idx = b.op("Add", [start, b.const(steps)])
    if mode == "circular":
        idx = b.op("Mod", [idx, b.const(np.array(past.shape[ax], np.int64))])
    idx = b.op("Expand", [idx], shape=tuple(update.shape))
    return b.op("ScatterElements", [past, idx, update], axis=ax, reduction="none")
