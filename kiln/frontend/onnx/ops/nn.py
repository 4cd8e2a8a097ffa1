"""Neural-network ONNX operators: Conv, Gemm, MatMul, BatchNormalization, pooling, Softmax."""

from __future__ import annotations

import math

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import norm_axis
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape, transpose
from kiln.ir.graph import Builder, Value

_reshape = reshape  # the name the converters import


def auto_pads(auto_pad: str, sizes, kernel, strides, dilations, pads) -> list[int]:
    """Explicit ``pads`` (all begins, then all ends) for ONNX ``auto_pad`` on spatial ``sizes``."""
    n = len(sizes)
    if auto_pad in ("NOTSET", ""):
        return list(pads) if pads else [0] * (2 * n)
    if auto_pad == "VALID":
        return [0] * (2 * n)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise KilnError(f"unknown auto_pad {auto_pad!r}")
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def window_attrs(x: Value, kernel, strides, dilations, pads, auto_pad: str) -> dict[str, tuple[int, ...]]:
    """Explicit ``strides``, ``dilations`` and ``pads`` of a sliding window (Conv, pools) over ``x``'s spatial axes.

    Omitted strides and dilations default to 1; ``auto_pad`` is resolved into pads.
    """
    nsp = len(x.shape) - 2
    strides = list(strides or [1] * nsp)
    dilations = list(dilations or [1] * nsp)
    pads = auto_pads(auto_pad, x.shape[2:], kernel, strides, dilations, pads)
    return {"strides": tuple(strides), "dilations": tuple(dilations), "pads": tuple(pads)}


@onnx_op("Conv", since=1)
def conv(b: Builder, x: Value, w: Value, bias: Value | None = None, *, auto_pad: str = "NOTSET",
         dilations=None, group: int = 1, kernel_shape=None, pads=None, strides=None) -> Value:
    """ONNX Conv-1/11: N-d grouped, strided, dilated convolution, bias added as a broadcast Add."""
    nsp = len(x.shape) - 2
    if nsp < 1 or len(w.shape) != nsp + 2:
        raise ShapeError(f"Conv: input {list(x.shape)} and weight {list(w.shape)} ranks do not fit")
    window = window_attrs(x, list(kernel_shape or w.shape[2:]), strides, dilations, pads, auto_pad)
    y = b.op("Conv", [x, w], **window, group=int(group))
    if bias is not None:
        y = b.op("Add", [y, _reshape(b, bias, (bias.shape[0],) + (1,) * nsp)])
    return y


def _matmul(b: Builder, a: Value, c: Value) -> Value:
    """numpy.matmul semantics, 1-D operands promoted and the added axis removed afterwards."""
    a2 = _reshape(b, a, (1, a.shape[0])) if len(a.shape) == 1 else a
    c2 = _reshape(b, c, (c.shape[0], 1)) if len(c.shape) == 1 else c
    y = b.op("MatMul", [a2, c2])
    shape = list(y.shape)
    if len(a.shape) == 1:
        shape.pop(-2)
    if len(c.shape) == 1:
        shape.pop(-1)
    return _reshape(b, y, tuple(shape))


@onnx_op("MatMul", since=1)
def matmul(b: Builder, a: Value, c: Value) -> Value:
    """ONNX MatMul-1/9/13: numpy.matmul."""
    return _matmul(b, a, c)


@onnx_op("Gemm", since=7)
def gemm(b: Builder, a: Value, c: Value, bias: Value | None = None, *, alpha: float = 1.0, beta: float = 1.0,
         transA: int = 0, transB: int = 0) -> Value:
    """ONNX Gemm-7/9/11/13: alpha * A' @ B' + beta * C with unidirectional broadcast of C."""
    if transA:
        a = transpose(b, a, (1, 0))
    if transB:
        c = transpose(b, c, (1, 0))
    y = b.op("MatMul", [a, c])
    if alpha != 1.0:
        y = b.op("Mul", [y, b.const(np.array(alpha, dtype=np.float32), dtype=y.dtype)])
    if bias is not None and beta != 0.0:
        if beta != 1.0:
            bias = b.op("Mul", [bias, b.const(np.array(beta, np.float32), dtype=bias.dtype)])
        y = b.op("Add", [y, bias])
    return y


@onnx_op("BatchNormalization", since=9)
def batch_norm(b: Builder, x: Value, scale: Value, bias: Value, mean: Value, var: Value, *,
               epsilon: float = 1e-5, momentum: float = 0.9, training_mode: int = 0, spatial: int = 1) -> Value:
    """ONNX BatchNormalization-9/14/15, inference form: x * s + (bias - mean * s), s = scale / sqrt(var + eps).

    The per-channel factors are graph ops on constants; constant folding evaluates them
    and scale folding merges them into a preceding Conv.
    """
    if training_mode:
        raise KilnError("BatchNormalization with training_mode=1 is not supported")
    shape = (x.shape[1],) + (1,) * (len(x.shape) - 2)
    eps = b.const(np.array(epsilon, np.float32), dtype=var.dtype)
    s = b.op("Div", [scale, b.op("Sqrt", [b.op("Add", [var, eps])])])
    shift = b.op("Sub", [bias, b.op("Mul", [mean, s])])
    return b.op("Add", [b.op("Mul", [x, _reshape(b, s, shape)]), _reshape(b, shift, shape)])


def _pool(b: Builder, op: str, x: Value, auto_pad: str, ceil_mode: int, dilations, kernel_shape, pads, strides,
          count_include_pad: int = 0) -> Value:
    nsp = len(x.shape) - 2
    if nsp < 1:
        raise ShapeError(f"{op}: input {list(x.shape)} has no spatial axes")
    window = window_attrs(x, list(kernel_shape), strides, dilations, pads, auto_pad)
    return b.op(op, [x], kernel_shape=tuple(kernel_shape), **window, ceil_mode=int(ceil_mode),
                count_include_pad=int(count_include_pad))


@onnx_op("MaxPool", since=1)
def max_pool(b: Builder, x: Value, *, kernel_shape, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations=None,
             pads=None, storage_order: int = 0, strides=None, _nout: int = 1) -> Value | list[Value]:
    """ONNX MaxPool-1/8/10/11/12, with the optional Indices output: the flat index (int64) into ``x`` of each
    window's first maximum, row-major, or with the spatial axes in column-major order for ``storage_order=1``."""
    y = _pool(b, "MaxPool", x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides)
    if _nout < 2:
        return y
    attrs = {"kernel_shape": tuple(kernel_shape), **window_attrs(x, list(kernel_shape), strides, dilations, pads,
                                                                  auto_pad)}
    return [y, _max_pool_indices(b, x, y, attrs, storage_order)]


def _max_pool_indices(b: Builder, x: Value, y: Value, attrs: dict, storage_order: int) -> Value:
    """MaxPool's Indices from the winning kernel offset of each window (the MaxPoolArgWindow primitive)."""
    nsp = len(x.shape) - 2
    k, s, d, p = attrs["kernel_shape"], attrs["strides"], attrs["dilations"], attrs["pads"]
    win = b.op("Cast", [b.op("MaxPoolArgWindow", [x, y], kernel_shape=tuple(k), strides=tuple(s),
                                dilations=tuple(d), pads=tuple(p))], to="int64")
    sizes = x.shape[2:]
    order = list(range(nsp)) if not storage_order else list(reversed(range(nsp)))
    flat = None
    inner = 1
    for i in reversed(order):  # the innermost axis first: flat = sum_i pos_i * stride_i
        shape = [1] * len(x.shape)
        shape[2 + i] = y.shape[2 + i]
        o = b.const((np.arange(y.shape[2 + i], dtype=np.int64) * s[i] - p[i]).reshape(shape))
        kstride = int(np.prod(k[i + 1:], dtype=np.int64))
        kidx = b.op("Mod", [b.op("Div", [win, b.const(np.array(kstride, np.int64))]),
                            b.const(np.array(k[i], np.int64))])
        pos = b.op("Add", [o, b.op("Mul", [kidx, b.const(np.array(d[i], np.int64))])])
        term = b.op("Mul", [pos, b.const(np.array(inner, np.int64))])
        flat = term if flat is None else b.op("Add", [flat, term])
        inner *= sizes[i]
    nc = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[0], x.shape[1], *([1] * nsp)) * inner
    return b.op("Add", [flat, b.const(nc)])


@onnx_op("AveragePool", since=1)
def average_pool(b: Builder, x: Value, *, kernel_shape, auto_pad: str = "NOTSET", ceil_mode: int = 0,
                 count_include_pad: int = 0, dilations=None, pads=None, strides=None) -> Value:
    """ONNX AveragePool-1/7/10/11/19."""
    return _pool(b, "AveragePool", x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides, count_include_pad)


@onnx_op("GlobalAveragePool", since=1)
def global_average_pool(b: Builder, x: Value) -> Value:
    """ONNX GlobalAveragePool-1: mean over all spatial axes, kept as size-1 dims."""
    return b.op("ReduceMean", [x], axes=tuple(range(2, len(x.shape))), keepdims=1)


@onnx_op("GlobalMaxPool", since=1)
def global_max_pool(b: Builder, x: Value) -> Value:
    """ONNX GlobalMaxPool-1: max over all spatial axes, kept as size-1 dims."""
    return b.op("ReduceMax", [x], axes=tuple(range(2, len(x.shape))), keepdims=1)


def _softmax_axis(b: Builder, x: Value, axis: int, log: bool) -> Value:
    m = b.op("ReduceMax", [x], axes=(axis,), keepdims=1)
    e = b.op("Exp", [b.op("Sub", [x, m])])
    s = b.op("ReduceSum", [e], axes=(axis,), keepdims=1)
    if log:
        return b.op("Sub", [b.op("Sub", [x, m]), b.op("Log", [s])])
    return b.op("Div", [e, s])


@onnx_op("Softmax", since=1)
def softmax_1(b: Builder, x: Value, *, axis: int = 1) -> Value:
    """ONNX Softmax-1/11: softmax over the input flattened to 2-D at ``axis``."""
    ax = norm_axis(axis, len(x.shape))
    flat = _reshape(b, x, (symbolic.prod(x.shape[:ax]), symbolic.prod(x.shape[ax:])))
    return _reshape(b, _softmax_axis(b, flat, 1, False), x.shape)


@onnx_op("Softmax", since=13)
def softmax_13(b: Builder, x: Value, *, axis: int = -1) -> Value:
    """ONNX Softmax-13: exp(x - max(x)) / sum(exp(x - max(x))) along ``axis``."""
    return _softmax_axis(b, x, norm_axis(axis, len(x.shape)), False)


@onnx_op("LogSoftmax", since=13)
def log_softmax_13(b: Builder, x: Value, *, axis: int = -1) -> Value:
    """ONNX LogSoftmax-13: x - max(x) - log(sum(exp(x - max(x)))) along ``axis``."""
    return _softmax_axis(b, x, norm_axis(axis, len(x.shape)), True)


@onnx_op("CausalConvWithState", since=27)
def causal_conv_with_state(b: Builder, x: Value, w: Value, bias: Value | None = None,
                           past_state: Value | None = None, *, activation: str = "none",
                           _nout: int = 1) -> list[Value]:
    """ONNX CausalConvWithState-27: depthwise 1-D convolution of [past_state, x] (zeros when no state) with
    optional SiLU; the second output is the last ``k - 1`` input columns (the next call's state).

    Raises KilnError for an unknown ``activation``; ShapeError for non-rank-3 inputs.
    """
    if activation not in ("none", "silu", "swish"):
        raise KilnError(f"CausalConvWithState: unknown activation {activation!r}")
    if len(x.shape) != 3 or len(w.shape) != 3:
        raise ShapeError(f"CausalConvWithState: input {list(x.shape)} and weight {list(w.shape)} must be rank 3")
    n, c, _length = x.shape
    k = w.shape[2]
    state = past_state if past_state is not None else b.const(np.zeros((n, c, k - 1), np.float32), dtype=x.dtype)
    padded = b.op("Concat", [state, x], axis=2) if k > 1 else x
    y = b.op("Conv", [padded, w], strides=(1,), dilations=(1,), pads=(0, 0), group=c)
    if bias is not None:
        y = b.op("Add", [y, _reshape(b, bias, (c, 1))])
    if activation != "none":
        y = b.op("Mul", [y, b.op("Sigmoid", [y])])
    total = padded.shape[2]
    present = b.op("Slice", [padded], starts=(0, 0, total - (k - 1)), ends=(n, c, total), steps=(1, 1, 1))
    return [y, present][:max(_nout, 1)]


@onnx_op("SwiGLU", since=28)
def swiglu(b: Builder, a: Value, c: Value, *, alpha: float = 1.0) -> Value:
    """ONNX SwiGLU-28: ``a * sigmoid(alpha * a) * b`` (same shapes, no broadcasting)."""
    if a.shape != c.shape:
        raise ShapeError(f"SwiGLU: inputs {list(a.shape)} and {list(c.shape)} differ in shape")
    ax = a if alpha == 1.0 else b.op("Mul", [a, b.const(np.array(alpha, np.float32), dtype=a.dtype)])
    return b.op("Mul", [b.op("Mul", [a, b.op("Sigmoid", [ax])]), c])
