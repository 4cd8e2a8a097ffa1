"""Reduction ONNX operators: ReduceSum/Mean/Max/Min/Prod, ReduceL1/L2/SumSquare/LogSum/LogSumExp, ArgMax/ArgMin."""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.ops.common import const_value, norm_axis
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def _reduce(b: Builder, op: str, x: Value, axes, keepdims: int, noop_with_empty_axes: int = 0) -> Value:
    rank = len(x.shape)
    if not axes:
        if noop_with_empty_axes:
            return b.op("Identity", [x])
        axes = range(rank)
    axes = tuple(sorted({norm_axis(a, rank) for a in axes}))
    if x.dtype == "bool":  # max/min of booleans are any/all: reduce their 0/1 integers
        y = b.op(op, [b.op("Cast", [x], to="int32")], axes=axes, keepdims=int(keepdims))
        return b.op("Greater", [y, b.const(np.array(0, np.int32))])  # the empty max (min) is false (true)
    return b.op(op, [x], axes=axes, keepdims=int(keepdims))


def _register(op: str, input_since: int) -> None:
    def attr_form(b: Builder, x: Value, *, axes=None, keepdims: int = 1) -> Value:
        return _reduce(b, op, x, axes, keepdims)

    def input_form(b: Builder, x: Value, axes: Value | None = None, *, keepdims: int = 1,
                   noop_with_empty_axes: int = 0) -> Value:
        ax = None if axes is None else const_value(axes, "axes").reshape(-1).tolist()
        return _reduce(b, op, x, ax, keepdims, noop_with_empty_axes)

    attr_form.__doc__ = f"ONNX {op}-1/11/13: axes as attribute."
    input_form.__doc__ = f"ONNX {op}-{input_since}: axes as an optional constant input."
    onnx_op(op, since=1)(attr_form)
    onnx_op(op, since=input_since)(input_form)


_register("ReduceSum", 13)
_register("ReduceMean", 18)
_register("ReduceMax", 18)
_register("ReduceMin", 18)


def _composite(b: Builder, op: str, x: Value, axes, keepdims: int, noop: int) -> Value:
    """ReduceL1/L2/SumSquare/LogSum/LogSumExp as primitives around a ReduceSum; ReduceProd is a primitive."""
    rank = len(x.shape)
    if not axes and noop:  # no reduction: only the elementwise part
        if op in ("ReduceL2", "ReduceSumSquare", "ReduceL1"):
            y = b.op("Abs", [x]) if op == "ReduceL1" else b.op("Mul", [x, x])
            return b.op("Sqrt", [y]) if op == "ReduceL2" else y
        if op == "ReduceLogSum":
            return b.op("Log", [x])
        if op == "ReduceLogSumExp":
            return b.op("Log", [b.op("Exp", [x])])
        return b.op("Identity", [x])
    axes = tuple(sorted({norm_axis(a, rank) for a in (axes or range(rank))}))
    if op == "ReduceProd":
        return b.op("ReduceProd", [x], axes=axes, keepdims=int(keepdims))
    if op == "ReduceLogSumExp":
        m = b.op("ReduceMax", [x], axes=axes, keepdims=1)
        inf = b.op("IsInf", [m], detect_negative=1, detect_positive=1)  # all -inf, or +inf: shift by 0 instead
        m = b.op("Where", [inf, b.const(np.zeros((1,) * rank), dtype=x.dtype), m])
        s = b.op("ReduceSum", [b.op("Exp", [b.op("Sub", [x, m])])], axes=axes, keepdims=1)
        y = b.op("Add", [b.op("Log", [s]), m])
        return y if keepdims else b.op("Reshape", [y], shape=tuple(d for i, d in enumerate(y.shape) if i not in axes))
    y = x
    if op == "ReduceL1":
        y = b.op("Abs", [x])
    elif op in ("ReduceL2", "ReduceSumSquare"):
        y = b.op("Mul", [x, x])
    s = b.op("ReduceSum", [y], axes=axes, keepdims=int(keepdims))
    if op == "ReduceL2":
        return b.op("Sqrt", [s])
    if op == "ReduceLogSum":
        return b.op("Log", [s])
    return s


def _register_composite(op: str) -> None:
    def attr_form(b: Builder, x: Value, *, axes=None, keepdims: int = 1) -> Value:
        return _composite(b, op, x, axes, keepdims, 0)

    def input_form(b: Builder, x: Value, axes: Value | None = None, *, keepdims: int = 1,
                   noop_with_empty_axes: int = 0) -> Value:
        ax = None if axes is None else const_value(axes, "axes").reshape(-1).tolist()
        return _composite(b, op, x, ax, keepdims, noop_with_empty_axes)

    attr_form.__doc__ = f"ONNX {op}-1/11/13: axes as attribute; decomposed around ReduceSum."
    input_form.__doc__ = f"ONNX {op}-18: axes as an optional constant input; decomposed around ReduceSum."
    onnx_op(op, since=1)(attr_form)
    onnx_op(op, since=18)(input_form)


for _op in ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd"):
    _register_composite(_op)


def _arg(op: str):
    def convert(b: Builder, x: Value, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Value:
        ax = norm_axis(axis, len(x.shape))
        best = b.op("ReduceMax" if op == "ArgMax" else "ReduceMin", [x], axes=(ax,), keepdims=1)
        return b.op(op, [x, best], axis=ax, keepdims=int(keepdims), select_last_index=int(select_last_index))

    convert.__doc__ = (f"ONNX {op}-1/11/12/13: int64 index of the first (or last) {op[3:].lower()} along ``axis``; "
                       f"a Reduce{op[3:]} kernel then one pass comparing against it.")
    return convert


onnx_op("ArgMax", since=1)(_arg("ArgMax"))
onnx_op("ArgMin", since=1)(_arg("ArgMin"))
