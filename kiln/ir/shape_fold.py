"""Constant folding of shape computations over run-time dims.

``Shape`` of a tensor with a run-time dim is a constant *object array* whose elements are ints and
size expressions (:mod:`kiln.arith.symbolic`). The ops a model applies to shapes (``Gather``,
``Unsqueeze``, ``Concat``, ``Slice``, ``Cast`` to an integer type, integer ``Add``/``Sub``/``Mul``/``Div``,
comparisons decided by the dims' bounds, ``Where``) fold here into new object arrays, so a
``Reshape`` or ``Expand`` later receives a symbolic target shape. What cannot fold (a comparison only
the run time can decide, a cast to float) is *materialized*: a ``SymConst`` kernel writes the values
at run time and the op runs as a kernel too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.arith import symbolic
from kiln.arith.expr import Expr, call, const
from kiln.errors import KilnError
from kiln.ir import ops

_ARITH = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
          "Max": lambda a, b: call("max", _e(a), _e(b)), "Min": lambda a, b: call("min", _e(a), _e(b))}
_CMP = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}
_INT = {"int64", "int32", "int16", "int8", "uint8", "uint16"}


def _e(x) -> Expr:
    return x if isinstance(x, Expr) else const(int(x), "int32")


def _objects(a: np.ndarray) -> np.ndarray:
    out = np.empty(a.shape, object)
    out.reshape(-1)[:] = [x if isinstance(x, Expr) else int(x) for x in a.reshape(-1)]
    return out


def _elementwise(fn, *arrays: np.ndarray) -> np.ndarray:
    bs = np.broadcast_arrays(*[_objects(np.asarray(a)) for a in arrays])
    out = np.empty(bs[0].shape, object)
    out.reshape(-1)[:] = [fn(*xs) for xs in zip(*(b.reshape(-1) for b in bs))]
    return out


def fold(op: str, xs: list[np.ndarray], attrs: dict[str, Any], out_types) -> list[np.ndarray] | None:
    """Fold primitive ``op`` over constants ``xs``, some of them object arrays of size expressions.

    Returns the results (object arrays where an element is symbolic), or None when ``op`` cannot be
    folded over size expressions (the caller then runs it as a kernel).
    """
    kind = ops.kind(op)
    if op in ("Identity", "Reshape") or kind == "layout" and op in ("Transpose", "Concat", "Slice", "Expand"):
        return ops.get(op).evaluate([_objects(x) for x in xs], attrs)
    if op == "Gather":
        if xs[1].dtype == object:
            return None
        return ops.get(op).evaluate([_objects(xs[0]), xs[1]], attrs)
    if op == "Cast":
        return [_objects(xs[0])] if attrs["to"] in _INT else None
    if op == "Neg":
        return [_elementwise(lambda a: -a, xs[0])]
    if op in _ARITH:
        return [_elementwise(_ARITH[op], *xs)]
    if op == "Div" and out_types[0][0] in _INT:
        def div(a, b):
            if symbolic.is_symbolic(b) or int(b) <= 0 or symbolic.bounds(symbolic.simplify(a))[0] < 0:
                raise _NoFold
            return symbolic.simplify(a // b) if symbolic.is_symbolic(a) else int(a) // int(b)
        try:
            return [_elementwise(div, *xs)]
        except _NoFold:
            return None
    if op in _CMP:
        def cmp(a, b):
            try:
                return symbolic.decide(_CMP[op], a, b)
            except KilnError:
                raise _NoFold from None
        try:
            return [_elementwise(cmp, *xs).astype(bool)]
        except _NoFold:
            return None
    if op == "Where":
        if xs[0].dtype == object:
            return None
        c, x, y = np.broadcast_arrays(xs[0], _objects(xs[1]), _objects(xs[2]))
        return [np.where(c, x, y)]
    return None


class _NoFold(Exception):
    pass


def materialize_inputs(b, op: str, inputs: list) -> list:
    """``inputs`` of a node that runs as a kernel, each object-array constant replaced by a ``SymConst``
    node computing its values at run time (scalars read by elementwise ops stay literals: a kernel reads
    the size expression from the dims uniform)."""
    out = []
    for v in inputs:
        if v.is_shape_const and not (ops.kind(op) in ("binary", "ternary") and v.const.size == 1):
            flat = tuple(symbolic.simplify(x) for x in v.const.reshape(-1))
            v = b.op("SymConst", [], name=f"{v.name}_values", shape=tuple(v.const.shape), values=flat,
                     dtype=v.dtype)
        out.append(v)
    return out
