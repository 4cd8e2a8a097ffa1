"""Layout helpers every frontend builds graphs with: a view as another shape and a permutation of axes, each
skipped when it would change nothing and folded at compile time for constants."""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.ir.graph import Builder, Value


def reshape(b: Builder, v: Value, shape) -> Value:
    """``v`` viewed as ``shape`` (ints or size expressions): ``v`` itself when the shape is its own, a new constant
    for a constant ``v``, else a ``Reshape`` node."""
    shape = symbolic.shape(shape)
    if tuple(shape) == tuple(v.shape):
        return v
    if v.is_const:
        return b.const(v.const.reshape(shape), name=v.name)
    return b.op("Reshape", [v], shape=shape)


def transpose(b: Builder, v: Value, perm) -> Value:
    """``v`` with its axes permuted by ``perm``: ``v`` itself for the identity, a new constant for a constant ``v``,
    else a ``Transpose`` node."""
    if list(perm) == list(range(len(perm))):
        return v
    if v.is_const:
        return b.const(np.ascontiguousarray(np.transpose(v.const, perm)), name=v.name + "_T")
    return b.op("Transpose", [v], perm=tuple(perm))
