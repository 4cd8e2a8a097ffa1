"""Elementwise ONNX operators: activations, arithmetic, Clip, Cast, Constant, Identity."""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.ops.common import const_value
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Value


def _unary(op: str):
    def convert(b: Builder, x: Value) -> Value:
        return b.op(op, [x])

    convert.__doc__ = f"ONNX {op}: elementwise, one input, same shape and dtype."
    return convert


for _op in ("Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Tanh", "Sigmoid", "Erf",
            "Floor", "Ceil", "Sin", "Cos", "Identity"):
    onnx_op(_op, since=1)(_unary(_op))


def _binary(op: str):
    def convert(b: Builder, x: Value, y: Value) -> Value:
        return b.op(op, [x, y])

    convert.__doc__ = f"ONNX {op}-7+: elementwise with multidirectional (numpy) broadcasting."
    return convert


for _op in ("Add", "Sub", "Mul", "Div", "Pow"):
    onnx_op(_op, since=7)(_binary(_op))


def _variadic(op: str):
    def convert(b: Builder, *xs: Value) -> Value:
        out = xs[0]
        for x in xs[1:]:
            out = b.op(op, [out, x])
        return out

    convert.__doc__ = f"ONNX {op}-8+: variadic elementwise {op.lower()} with broadcasting."
    return convert


onnx_op("Max", since=8)(_variadic("Max"))
onnx_op("Min", since=8)(_variadic("Min"))
onnx_op("Sum", since=8)(_variadic("Add"))


@onnx_op("Clip", since=6)
def clip_6(b: Builder, x: Value, *, min: float = -3.4028234663852886e38, max: float = 3.4028234663852886e38) -> Value:
    """ONNX Clip-6: bounds as attributes."""
    return b.op("Clip", [x], min=float(min), max=float(max))


@onnx_op("Clip", since=11)
def clip_11(b: Builder, x: Value, lo: Value | None = None, hi: Value | None = None) -> Value:
    """ONNX Clip-11+: bounds as optional inputs; constant bounds fold into one Clip, others become Max/Min."""
    attrs = {}
    for key, bound, op in (("min", lo, "Max"), ("max", hi, "Min")):
        if bound is None:
            continue
        if bound.is_const:
            attrs[key] = float(bound.const.reshape(()))
        else:
            x = b.op(op, [x, bound])
    return b.op("Clip", [x], **attrs) if attrs else x


@onnx_op("LeakyRelu", since=6)
def leaky_relu(b: Builder, x: Value, *, alpha: float = 0.01) -> Value:
    """ONNX LeakyRelu-6: x if x >= 0 else alpha * x."""
    return b.op("LeakyRelu", [x], alpha=float(alpha))


@onnx_op("HardSigmoid", since=6)
def hard_sigmoid(b: Builder, x: Value, *, alpha: float = 0.2, beta: float = 0.5) -> Value:
    """ONNX HardSigmoid-6: clip(alpha * x + beta, 0, 1)."""
    return b.op("HardSigmoid", [x], alpha=float(alpha), beta=float(beta))


@onnx_op("HardSwish", since=14)
def hard_swish(b: Builder, x: Value) -> Value:
    """ONNX HardSwish-14: x * HardSigmoid(x, alpha=1/6, beta=0.5)."""
    return b.op("Mul", [x, b.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)])


@onnx_op("Cast", since=6)
def cast(b: Builder, x: Value, *, to: int, saturate: int = 1) -> Value:
    """ONNX Cast-6+ (numeric types only)."""
    return b.op("Cast", [x], to=dtypes.from_onnx(to))


@onnx_op("Constant", since=1)
def constant(b: Builder, *, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None) -> Value:
    """ONNX Constant-1+ (tensor, float(s) and int(s) forms)."""
    if value is not None:
        return b.const(value, name=b.scope)
    if value_float is not None:
        return b.const(np.float32(value_float), name=b.scope)
    if value_floats is not None:
        return b.const(np.array(value_floats, np.float32), name=b.scope)
    if value_int is not None:
        return b.const(np.int64(value_int), name=b.scope)
    return b.const(np.array(const_value_list(value_ints), np.int64), name=b.scope)


def const_value_list(xs):
    """``xs`` as a list (empty for None)."""
    return list(xs) if xs is not None else []


__all__ = ["const_value"]
