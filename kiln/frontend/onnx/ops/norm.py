"""Normalisation ONNX operators, decomposed into reductions and elementwise primitives:
LayerNormalization, RMSNormalization, InstanceNormalization, GroupNormalization,
MeanVarianceNormalization, LpNormalization, LRN.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend import decoder
from kiln.frontend.onnx.ops.common import norm_axis
from kiln.frontend.onnx.ops.nn import _reshape
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def _scalar(b: Builder, value: float, like: Value) -> Value:
    return b.const(np.array(value), dtype=like.dtype)


def _moments(b: Builder, x: Value, axes: tuple[int, ...]) -> tuple[Value, Value, Value]:
    """``(mean, x - mean, variance)`` over ``axes`` (kept as size-1 dims), variance as mean((x - mean)^2)."""
    mean = b.op("ReduceMean", [x], axes=axes, keepdims=1)
    d = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Mul", [d, d])], axes=axes, keepdims=1)
    return mean, d, var


def _affine(b: Builder, y: Value, scale: Value | None, bias: Value | None) -> Value:
    if scale is not None:
        y = b.op("Mul", [y, scale])
    if bias is not None:
        y = b.op("Add", [y, bias])
    return y


@onnx_op("LayerNormalization", since=17)
def layer_norm(b: Builder, x: Value, scale: Value, bias: Value | None = None, *, axis: int = -1,
               epsilon: float = 1e-5, stash_type: int = 1, _nout: int = 1) -> list[Value]:
    """ONNX LayerNormalization-17: ``(x - mean) / sqrt(var + eps) * scale + bias`` over the dims from ``axis`` on.

    The optional outputs Mean and InvStdDev keep the normalised dims as size 1.
    """
    rank = len(x.shape)
    ax = norm_axis(axis, rank)
    axes = tuple(range(ax, rank))
    mean, d, var = _moments(b, x, axes)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, _scalar(b, epsilon, var)])])])
    y = _affine(b, b.op("Mul", [d, inv]), scale, bias)
    return [y, mean, inv][:max(_nout, 1)]


@onnx_op("RMSNormalization", since=23)
def rms_norm(b: Builder, x: Value, scale: Value, *, axis: int = -1, epsilon: float = 1e-5,
             stash_type: int = 1) -> Value:
    """ONNX RMSNormalization-23: ``x / sqrt(mean(x^2) + eps) * scale`` over the dims from ``axis`` on."""
    rank = len(x.shape)
    return decoder.rms_norm(b, x, scale, epsilon, tuple(range(norm_axis(axis, rank), rank)))


def _channel(b: Builder, v: Value, rank: int) -> Value:
    return _reshape(b, v, (v.shape[0],) + (1,) * (rank - 2))


@onnx_op("InstanceNormalization", since=6)
def instance_norm(b: Builder, x: Value, scale: Value, bias: Value, *, epsilon: float = 1e-5) -> Value:
    """ONNX InstanceNormalization-6: per sample and channel over the spatial dims, then per-channel affine."""
    rank = len(x.shape)
    if rank < 3:
        raise ShapeError(f"InstanceNormalization: input {list(x.shape)} has no spatial dims")
    _, d, var = _moments(b, x, tuple(range(2, rank)))
    y = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, _scalar(b, epsilon, var)])])])
    return _affine(b, y, _channel(b, scale, rank), _channel(b, bias, rank))


@onnx_op("GroupNormalization", since=18)
def group_norm(b: Builder, x: Value, scale: Value, bias: Value, *, epsilon: float = 1e-5, num_groups: int,
               stash_type: int = 1, _opset: int = 21) -> Value:
    """ONNX GroupNormalization-18/21: per sample over each group of channels and the spatial dims.

    From opset 21 ``scale`` and ``bias`` are per channel; in 18 they were per group.
    """
    n, c = x.shape[:2]
    rest = x.shape[2:]
    g = int(num_groups)
    if c % g:
        raise ShapeError(f"GroupNormalization: {c} channels do not split into {g} groups")
    xg = _reshape(b, x, (n, g, c // g, *rest))
    _, d, var = _moments(b, xg, tuple(range(2, len(xg.shape))))
    y = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, _scalar(b, epsilon, var)])])])
    if _opset < 21:
        y = _affine(b, y, _reshape(b, scale, (g,) + (1,) * (len(xg.shape) - 2)),
                    _reshape(b, bias, (g,) + (1,) * (len(xg.shape) - 2)))
        return _reshape(b, y, x.shape)
    y = _reshape(b, y, x.shape)
    return _affine(b, y, _channel(b, scale, len(x.shape)), _channel(b, bias, len(x.shape)))


@onnx_op("MeanVarianceNormalization", since=9)
def mean_variance_norm(b: Builder, x: Value, *, axes=(0, 2, 3)) -> Value:
    """ONNX MeanVarianceNormalization-9/13: ``(x - mean) / sqrt(var)`` over ``axes`` (onnx's reference adds 1e-9)."""
    rank = len(x.shape)
    _, d, var = _moments(b, x, tuple(sorted(norm_axis(a, rank) for a in axes)))
    return b.op("Div", [d, b.op("Add", [b.op("Sqrt", [var]), _scalar(b, 1e-9, var)])])


@onnx_op("LpNormalization", since=1)
def lp_norm(b: Builder, x: Value, *, axis: int = -1, p: int = 2) -> Value:
    """ONNX LpNormalization-1/22: ``x / ||x||_p`` along ``axis`` (p = 1 or 2); a zero norm gives 0."""
    ax = norm_axis(axis, len(x.shape))
    if p == 1:
        norm = b.op("ReduceSum", [b.op("Abs", [x])], axes=(ax,), keepdims=1)
    elif p == 2:
        norm = b.op("Sqrt", [b.op("ReduceSum", [b.op("Mul", [x, x])], axes=(ax,), keepdims=1)])
    else:
        raise KilnError(f"LpNormalization: p must be 1 or 2, got {p}")
    zero = b.op("Equal", [norm, _scalar(b, 0.0, norm)])
    safe = b.op("Where", [zero, _scalar(b, 1.0, norm), norm])
    return b.op("Div", [x, safe])


@onnx_op("LRN", since=1)
def lrn(b: Builder, x: Value, *, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> Value:
    """ONNX LRN-1/13: ``x / (bias + alpha / size * sum of x^2 over a window of channels) ^ beta``.

    The channel window sum is an AveragePool (count_include_pad) over the channels of x^2 viewed as NC'HW.
    """
    n, c = x.shape[:2]
    rest = int(np.prod(x.shape[2:], dtype=np.int64))
    sq = _reshape(b, b.op("Mul", [x, x]), (n, 1, c, rest))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    avg = b.op("AveragePool", [sq], kernel_shape=(size, 1), strides=(1, 1), dilations=(1, 1), pads=(lo, 0, hi, 0),
               ceil_mode=0, count_include_pad=1)
    total = _reshape(b, avg, x.shape)  # mean over the window = sum / size
    base = b.op("Add", [b.op("Mul", [total, _scalar(b, alpha, x)]), _scalar(b, bias, x)])
    return b.op("Div", [x, b.op("Pow", [base, _scalar(b, beta, x)])])
