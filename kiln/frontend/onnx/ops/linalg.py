"""Linear-algebra ONNX operators: Det."""

from __future__ import annotations

import itertools

import numpy as np

from kiln.errors import KilnError, ShapeError
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
