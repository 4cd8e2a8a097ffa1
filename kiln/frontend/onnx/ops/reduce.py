"""Reduction ONNX operators: ReduceSum, ReduceMean, ReduceMax, ReduceMin."""

from __future__ import annotations

from kiln.frontend.onnx.ops.common import const_value, norm_axis
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def _reduce(b: Builder, op: str, x: Value, axes, keepdims: int, noop_with_empty_axes: int = 0) -> Value:
    rank = len(x.shape)
    if not axes:
        if noop_with_empty_axes:
            return b.op("Identity", [x])
        axes = range(rank)
    return b.op(op, [x], axes=tuple(sorted({norm_axis(a, rank) for a in axes})), keepdims=int(keepdims))


def _register(op: str, input_since: int) -> None:
    def attr_form(b: Builder, x: Value, *, axes=None, keepdims: int = 1) -> Value:
        return _reduce(b, op, x, axes, keepdims)

    def input_form(b: Builder, x: Value, axes: Value | None = None, *, keepdims: int = 1,
                   noop_with_empty_axes: int = 0) -> Value:
        ax = None if axes is None else const_value(axes, "axes").tolist()
        return _reduce(b, op, x, ax, keepdims, noop_with_empty_axes)

    attr_form.__doc__ = f"ONNX {op}-1/11/13: axes as attribute."
    input_form.__doc__ = f"ONNX {op}-{input_since}: axes as an optional constant input."
    onnx_op(op, since=1)(attr_form)
    onnx_op(op, since=input_since)(input_form)


_register("ReduceSum", 13)
_register("ReduceMean", 18)
_register("ReduceMax", 18)
_register("ReduceMin", 18)


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
