"""Elementwise ONNX operators: activations, arithmetic, Clip, Cast, Constant, Identity."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
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
            "Floor", "Ceil", "Sin", "Cos", "Identity", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
            "Acosh", "Atanh", "Sign", "Round", "IsNaN", "Softplus", "Softsign", "Mish"):
    onnx_op(_op, since=1)(_unary(_op))


def _binary(op: str):
    def convert(b: Builder, x: Value, y: Value) -> Value:
        return b.op(op, [x, y])

    convert.__doc__ = f"ONNX {op}-7+: elementwise with multidirectional (numpy) broadcasting."
    return convert


for _op in ("Add", "Sub", "Mul", "Div", "Pow"):
    onnx_op(_op, since=7)(_binary(_op))


@onnx_op("Pow", since=12)
def pow_12(b: Builder, x: Value, y: Value) -> Value:
    """ONNX Pow-12/13/15: the exponent may have another dtype than the base; it is cast to the base's dtype."""
    if y.dtype != x.dtype:
        y = b.op("Cast", [y], to=x.dtype)
    return b.op("Pow", [x, y])


@onnx_op("Mod", since=10)
def mod(b: Builder, x: Value, y: Value, *, fmod: int = 0) -> Value:
    """ONNX Mod-10/13: ``fmod=0`` (integers only) takes the divisor's sign; ``fmod=1`` the dividend's (C fmod)."""
    return b.op("FMod" if fmod else "Mod", [x, y])


@onnx_op("PRelu", since=7)
def prelu(b: Builder, x: Value, slope: Value) -> Value:
    """ONNX PRelu-7/9/16: ``x`` if ``x >= 0`` else ``slope * x``, ``slope`` broadcast to ``x``."""
    return b.op("PRelu", [x, slope])


@onnx_op("Mean", since=8)
def mean(b: Builder, *xs: Value) -> Value:
    """ONNX Mean-8/13: elementwise mean of the inputs, with broadcasting."""
    out = xs[0]
    for x in xs[1:]:
        out = b.op("Add", [out, x])
    if len(xs) == 1:
        return b.op("Identity", [out])
    return b.op("Div", [out, b.const(np.array(len(xs)), dtype=out.dtype)])


def _activation(op: str, doc: str, **defaults: float):
    def convert(b: Builder, x: Value, **attrs: float) -> Value:
        unknown = set(attrs) - set(defaults)
        if unknown:
            raise KilnError(f"{op}: unknown attributes {sorted(unknown)}")
        return b.op(op, [x], **{k: float(attrs.get(k, v)) for k, v in defaults.items()})

    convert.__doc__ = doc
    return convert


onnx_op("Elu", since=6)(_activation("Elu", "ONNX Elu-6: x if x >= 0 else alpha * (exp(x) - 1).", alpha=1.0))
onnx_op("Selu", since=6)(_activation("Selu", "ONNX Selu-6: gamma * (x if x > 0 else alpha * (exp(x) - 1)).",
                                     alpha=1.67326319217681884765625, gamma=1.05070102214813232421875))
onnx_op("Celu", since=12)(_activation("Celu", "ONNX Celu-12: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)).",
                                      alpha=1.0))
onnx_op("ThresholdedRelu", since=10)(_activation("ThresholdedRelu", "ONNX ThresholdedRelu-10: x if x > alpha else 0.",
                                                 alpha=1.0))
onnx_op("Shrink", since=9)(_activation("Shrink", "ONNX Shrink-9: x + bias if x < -lambd, x - bias if x > lambd, else 0.",
                                       bias=0.0, lambd=0.5))


@onnx_op("IsInf", since=10)
def is_inf(b: Builder, x: Value, *, detect_negative: int = 1, detect_positive: int = 1) -> Value:
    """ONNX IsInf-10/20: bool mask of infinities (of the signs asked for)."""
    return b.op("IsInf", [x], detect_negative=int(detect_negative), detect_positive=int(detect_positive))


@onnx_op("Gelu", since=20)
def gelu(b: Builder, x: Value, *, approximate: str = "none") -> Value:
    """ONNX Gelu-20: 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation with ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise KilnError(f"Gelu: unknown approximate={approximate!r}")
    return b.op("Gelu", [x], approximate=approximate)


@onnx_op("Swish", since=24)
def swish(b: Builder, x: Value, *, alpha: float = 1.0) -> Value:
    """ONNX Swish-24: x * sigmoid(alpha * x)."""
    ax = b.op("Mul", [x, b.const(np.array(alpha), dtype=x.dtype)]) if alpha != 1.0 else x
    return b.op("Mul", [x, b.op("Sigmoid", [ax])])


@onnx_op("CastLike", since=15)
def cast_like(b: Builder, x: Value, like: Value, *, saturate: int = 1, round_mode: str = "up") -> Value:
    """ONNX CastLike-15/19/21: Cast ``x`` to the dtype of ``like``."""
    return _cast(b, x, like.dtype, saturate, round_mode) if x.dtype != like.dtype else b.op("Identity", [x])


@onnx_op("Dropout", since=7)
def dropout_7(b: Builder, x: Value, *, ratio: float = 0.5, is_test: int = 0) -> list[Value]:
    """ONNX Dropout-7/10 at inference: the identity, and an all-true mask as the optional second output."""
    return [b.op("Identity", [x]), b.const(np.ones(x.shape, bool), name=b.scope + "_mask")]


@onnx_op("Dropout", since=12)
def dropout(b: Builder, x: Value, ratio: Value | None = None, training_mode: Value | None = None, *,
            seed: int = 0) -> list[Value]:
    """ONNX Dropout-12/13 at inference: the identity, and an all-true mask as the optional second output.

    Raises KilnError if ``training_mode`` is a constant true (training is out of scope).
    """
    if training_mode is not None and (not training_mode.is_const or bool(training_mode.const)):
        raise KilnError("Dropout with training_mode is not supported (inference only)")
    return [b.op("Identity", [x]), b.const(np.ones(x.shape, bool), name=b.scope + "_mask")]


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
def cast(b: Builder, x: Value, *, to: int, saturate: int = 1, round_mode: str = "up") -> Value:
    """ONNX Cast-6/13/19/21/23/24 (numeric types only). ``saturate`` applies to float8 targets:
    out-of-range values and infinities become the largest finite value (kiln.kernels.narrow)."""
    return _cast(b, x, dtypes.from_onnx(to), saturate, round_mode)


def _cast(b: Builder, x: Value, to: str, saturate: int, round_mode: str = "up") -> Value:
    if to == "float8e8m0":
        if round_mode not in ("up", "down", "nearest"):
            raise KilnError(f"Cast: unknown round_mode {round_mode!r}")
        return b.op("Cast", [x], to=to, saturate=int(saturate), round_mode=round_mode)
    if to.startswith("float8"):
        return b.op("Cast", [x], to=to, saturate=int(saturate))
    return b.op("Cast", [x], to=to)


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


@onnx_op("BitCast", since=26)
def bit_cast(b: Builder, x: Value, *, to: int) -> Value:
    """ONNX BitCast-26: reinterpret the bits as another type of the same width (float32 and int32 through WGSL's
    ``bitcast``; 8-, 16- and 32-bit integers by wrapping into the other signedness; bool to uint8).

    Raises KilnError for widths or types the webgpu target does not store (64-bit, float16).
    """
    dst = dtypes.from_onnx(to)
    src = x.dtype
    if src == dst:
        return b.op("Identity", [x])
    if (src, dst) == ("float32", "int32"):
        return b.op("BitcastInt32", [x])
    if (src, dst) == ("int32", "float32"):
        return b.op("BitcastFloat32", [x])
    if {src, dst} in ({"int8", "uint8"}, {"int16", "uint16"}, {"int32", "uint32"}) or (src, dst) == ("bool", "uint8"):
        return b.op("Cast", [x], to=dst)
    raise KilnError(f"BitCast from {src} to {dst} is not supported")
