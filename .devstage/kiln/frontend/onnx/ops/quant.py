"""Linear quantisation ONNX operators, decomposed into elementwise primitives: QuantizeLinear,
DequantizeLinear, DynamicQuantizeLinear (8- and 16-bit integer types)."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
from kiln.frontend.onnx.ops.common import norm_axis
from kiln.frontend.onnx.ops.nn import _reshape
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Value

_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
           "int32": (-(2**31), 2**31 - 1), "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _along(b: Builder, p: Value, x: Value, axis: int, block_size: int) -> Value:
    """Per-tensor, per-axis or blocked parameter ``p`` shaped to broadcast against ``x``."""
    rank = len(x.shape)
    if p.size == 1 and not block_size:
        return _reshape(b, p, ())
    ax = norm_axis(axis, rank)
    if block_size:
        idx = b.const(np.arange(x.shape[ax], dtype=np.int64) // int(block_size))
        return b.op("Gather", [p, idx], axis=ax)
    return _reshape(b, p, tuple(x.shape[ax] if d == ax else 1 for d in range(rank)))


def _saturate_cast(b: Builder, y: Value, dtype: str) -> Value:
    if dtype not in _RANGES:
        raise KilnError(f"quantisation to {dtype} is not supported")
    lo, hi = _RANGES[dtype]
    return b.op("Cast", [b.op("Clip", [y], min=float(lo), max=float(hi))], to=dtype)


@onnx_op("DequantizeLinear", since=10)
def dequantize_linear(b: Builder, x: Value, scale: Value, zero_point: Value | None = None, *, axis: int = 1,
                      block_size: int = 0, output_dtype: int = 0) -> Value:
    """ONNX DequantizeLinear-10/13/19/21/23/24: ``(x - zero_point) * scale``, per tensor, per axis or per block."""
    xf = b.op("Cast", [x], to=scale.dtype)
    if zero_point is not None:
        xf = b.op("Sub", [xf, b.op("Cast", [_along(b, zero_point, x, axis, block_size)], to=scale.dtype)])
    y = b.op("Mul", [xf, _along(b, scale, x, axis, block_size)])
    out = dtypes.from_onnx(output_dtype) if output_dtype else scale.dtype
    return y if out == y.dtype else b.op("Cast", [y], to=out)


@onnx_op("QuantizeLinear", since=10)
def quantize_linear(b: Builder, x: Value, scale: Value, zero_point: Value | None = None, *, axis: int = 1,
                    saturate: int = 1, block_size: int = 0, output_dtype: int = 0, precision: int = 0) -> Value:
    """ONNX QuantizeLinear-10/13/19/21/23/24: ``saturate(round_half_even(x / scale) + zero_point)``, per tensor,
    per axis or per block; to 2-, 4-, 8- and 16-bit integers, float8 (``saturate`` as Cast's) and float4e2m1.

    The result type is the zero point's, else ``output_dtype``, else uint8.
    """
    out = zero_point.dtype if zero_point is not None else dtypes.from_onnx(output_dtype) if output_dtype else "uint8"
    xs = b.op("Cast", [x], to="float32") if x.dtype != "float32" else x
    s = _along(b, scale, x, axis, block_size)
    s = b.op("Cast", [s], to="float32") if s.dtype != "float32" else s
    if out in dtypes.NARROW_FLOATS:  # float8 / float4: x / scale + zero_point, rounded by the Cast (to nearest even)
        y = b.op("Div", [xs, s])
        if zero_point is not None:
            y = b.op("Add", [y, b.op("Cast", [_along(b, zero_point, x, axis, block_size)], to="float32")])
        attrs = {"saturate": int(saturate)} if out.startswith("float8") else {}
        return b.op("Cast", [y], to=out, **attrs)
    y = b.op("Round", [b.op("Div", [xs, s])])
    if zero_point is not None:
        y = b.op("Add", [y, b.op("Cast", [_along(b, zero_point, x, axis, block_size)], to="float32")])
    return _saturate_cast(b, y, out)


@onnx_op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(b: Builder, x: Value) -> list[Value]:
    """ONNX DynamicQuantizeLinear-11: uint8 ``y``, float scale and uint8 zero point from x's range (with 0)."""
    axes = tuple(range(len(x.shape)))
    zero = b.const(np.array(0.0, np.float32))
    lo = b.op("Min", [b.op("ReduceMin", [x], axes=axes, keepdims=0), zero])
    hi = b.op("Max", [b.op("ReduceMax", [x], axes=axes, keepdims=0), zero])
    scale = b.op("Div", [b.op("Sub", [hi, lo]), b.const(np.array(255.0, np.float32))])
    zp = _saturate_cast(b, b.op("Round", [b.op("Div", [b.op("Neg", [lo]), scale])]), "uint8")
    y = b.op("Add", [b.op("Round", [b.op("Div", [x, scale])]), b.op("Cast", [zp], to="float32")])
    return [_saturate_cast(b, y, "uint8"), scale, zp]
