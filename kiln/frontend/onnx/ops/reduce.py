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
