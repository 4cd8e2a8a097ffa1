"""More indexing ONNX operators: GatherND, ScatterElements, Scatter, ScatterND, TensorScatter, TopK, CumProd, Hardmax,
CenterCropPad, and the window generators (HannWindow, HammingWindow, BlackmanWindow)."""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError
from kiln.frontend.onnx.ops.common import const_value, norm_axis
from kiln.frontend.onnx.ops.compaction import topk_count
from kiln.frontend.onnx.ops.indexing import _pad, _slice, slice_attrs
from kiln.frontend.onnx.ops.nn import _reshape, window_attrs
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Value


@onnx_op("GatherND", since=11)
def gather_nd(b: Builder, x: Value, indices: Value, *, batch_dims: int = 0) -> Value:
    """ONNX GatherND-11/12/13: slices of ``x`` addressed by the last dim of ``indices``."""
    return b.op("GatherND", [x, indices], batch_dims=int(batch_dims))


@onnx_op("ScatterElements", since=11)
def scatter_elements(b: Builder, x: Value, indices: Value, updates: Value, *, axis: int = 0,
                     reduction: str = "none") -> Value:
    """ONNX ScatterElements-11/13/16/18: ``x`` with ``updates`` written (or added, multiplied, max-ed, min-ed)
    at ``indices`` along ``axis``."""
    return b.op("ScatterElements", [x, indices, updates], axis=norm_axis(axis, len(x.shape)), reduction=reduction)


@onnx_op("Scatter", since=9)
def scatter(b: Builder, x: Value, indices: Value, updates: Value, *, axis: int = 0) -> Value:
    """ONNX Scatter-9/11 (deprecated): ScatterElements without reduction."""
    return b.op("ScatterElements", [x, indices, updates], axis=norm_axis(axis, len(x.shape)), reduction="none")


@onnx_op("ScatterND", since=11)
def scatter_nd(b: Builder, x: Value, indices: Value, updates: Value, *, reduction: str = "none") -> Value:
    """ONNX ScatterND-11/13/16/18: ``x`` with ``updates`` written (or reduced) at the index tuples ``indices``."""
    return b.op("ScatterND", [x, indices, updates], reduction=reduction)


#: axis lengths beyond which TopK ranks by comparison counts and a scatter (:func:`rank_order`) rather than
#: ``TopKIndices``, whose every output element recounts the ranks (n^2 steps each)
RANKED = 32


def rank_order(b: Builder, x: Value, axis: int, largest: int = 1) -> Value:
    """int32 of ``x``'s (static) shape: along ``axis``, the index of the element of each rank (descending when
    ``largest``, else ascending; ties: the lower index first, as ONNX TopK orders them). Each element's rank is a
    count of comparisons (n steps per element, one kernel), then a ScatterElements writes each index at its rank."""
    shape, rank = tuple(x.shape), len(x.shape)
    n = shape[axis]
    col = reshape(b, x, shape[:axis + 1] + (1,) + shape[axis + 1:])  # [.., e, 1, ..]
    row = reshape(b, x, shape[:axis] + (1,) + shape[axis:])  # [.., 1, f, ..]
    before = b.const(np.tril(np.ones((n, n), bool), -1).reshape((n, n) + (1,) * (rank - axis - 1)))  # f < e
    better = b.op("Greater" if largest else "Less", [row, col])
    ahead = b.op("Or", [better, b.op("And", [b.op("Equal", [row, col]), before])])
    ranks = b.op("ReduceSum", [b.op("Cast", [ahead], to="int32")], axes=(axis + 1,), keepdims=0)
    index = b.op("Expand", [b.const(np.arange(n, dtype=np.int32).reshape((n,) + (1,) * (rank - axis - 1)))],
                 shape=shape)
    zeros = b.op("Expand", [b.const(np.zeros((), np.int32))], shape=shape)
    return b.op("ScatterElements", [zeros, ranks, index], axis=axis, reduction="none")


def _topk(b: Builder, x: Value, k: int, axis: int, largest: int) -> list[Value]:
    ax = norm_axis(axis, len(x.shape))
    if symbolic.is_static([k, *x.shape]) and x.shape[ax] > RANKED:
        order = rank_order(b, x, ax, largest)
        ends = tuple(int(k) if d == ax else n for d, n in enumerate(x.shape))
        idx = b.op("Cast", [b.op("Slice", [order], starts=(0,) * len(ends), ends=ends, steps=(1,) * len(ends))],
                   to="int64")
    else:
        idx = b.op("TopKIndices", [x], axis=ax, k=k if symbolic.is_symbolic(k) else int(k), largest=int(largest))
    return [b.op("GatherElements", [x, idx], axis=ax), idx]


@onnx_op("TopK", since=1)
def topk_1(b: Builder, x: Value, *, k: int, axis: int = -1) -> list[Value]:
    """ONNX TopK-1: the ``k`` largest values along ``axis`` and their int64 indices, sorted."""
    return _topk(b, x, k, axis, 1)


@onnx_op("TopK", since=10)
def topk_10(b: Builder, x: Value, k: Value, *, axis: int = -1, largest: int = 1, sorted: int = 1) -> list[Value]:
    """ONNX TopK-10/11/24: the ``k`` largest or smallest values and indices, sorted (ties: lower index); a ``k``
    computed at run time is a data-dependent dim (:func:`kiln.frontend.onnx.ops.compaction.topk_count`)."""
    if not k.is_const:
        return _topk(b, x, topk_count(b, k, x.shape[norm_axis(axis, len(x.shape))]), axis, largest)
    return _topk(b, x, int(const_value(k, "K").reshape(-1)[0]), axis, largest)


@onnx_op("CumProd", since=26)
def cumprod(b: Builder, x: Value, axis: Value, *, exclusive: int = 0, reverse: int = 0) -> Value:
    """ONNX CumProd-26: running product along the constant ``axis``."""
    ax = norm_axis(int(const_value(axis, "axis").reshape(())), len(x.shape))
    return b.op("CumProd", [x], axis=ax, exclusive=int(exclusive), reverse=int(reverse))


def _hardmax(b: Builder, x: Value, ax: int) -> Value:
    best = b.op("ReduceMax", [x], axes=(ax,), keepdims=1)
    arg = b.op("ArgMax", [x, best], axis=ax, keepdims=1, select_last_index=0)
    iota = np.arange(x.shape[ax], dtype=np.int64).reshape([-1 if d == ax else 1 for d in range(len(x.shape))])
    return b.op("Cast", [b.op("Equal", [b.const(iota), arg])], to=x.dtype)


@onnx_op("Hardmax", since=1)
def hardmax_1(b: Builder, x: Value, *, axis: int = 1) -> Value:
    """ONNX Hardmax-1/11: one-hot of the first maximum of the input flattened to 2-D at ``axis``."""
    ax = norm_axis(axis, len(x.shape))
    rows = int(np.prod(x.shape[:ax], dtype=np.int64))
    flat = _reshape(b, x, (rows, int(np.prod(x.shape[ax:], dtype=np.int64))))
    return _reshape(b, _hardmax(b, flat, 1), x.shape)


@onnx_op("Hardmax", since=13)
def hardmax_13(b: Builder, x: Value, *, axis: int = -1) -> Value:
    """ONNX Hardmax-13: one-hot (in ``x``'s dtype) of the first maximum along ``axis``."""
    return _hardmax(b, x, norm_axis(axis, len(x.shape)))


@onnx_op("CenterCropPad", since=18)
def center_crop_pad(b: Builder, x: Value, shape: Value, *, axes=None) -> Value:
    """ONNX CenterCropPad-18: crop (centred, extra element at the end) or zero-pad (centred) to ``shape``."""
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank) for a in axes]
    target = [int(v) for v in const_value(shape, "shape").tolist()]
    starts, ends, pads = [], [], [0] * (2 * rank)
    for a, t in zip(axes, target):
        d = x.shape[a]
        if t < d:
            s = (d - t) // 2
            starts.append(s)
            ends.append(s + t)
        else:
            starts.append(0)
            ends.append(d)
            pads[a], pads[rank + a] = (t - d) // 2, t - d - (t - d) // 2
    y = _slice(b, x, slice_attrs(x.shape, starts, ends, axes, None))
    return _pad(b, y, pads, "constant", 0.0) if any(pads) else y


def _window(name: str, coeffs: list[float]):
    def convert(b: Builder, size: Value, *, output_datatype: int = 1, periodic: int = 1) -> Value:
        n = int(const_value(size, "size").reshape(()))
        denom = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        w = sum(c * np.cos(2 * np.pi * m * k / max(denom, 1)) * (-1) ** m for m, c in enumerate(coeffs))
        return b.const(w.astype(dtypes.NUMPY[dtypes.from_onnx(output_datatype)]), name=b.scope)

    convert.__doc__ = f"ONNX {name}-17: the window of constant length ``size``, folded to a constant."
    return convert


onnx_op("HannWindow", since=17)(_window("HannWindow", [0.5, 0.5]))
onnx_op("HammingWindow", since=17)(_window("HammingWindow", [25 / 46, 21 / 46]))
onnx_op("BlackmanWindow", since=17)(_window("BlackmanWindow", [0.42, 0.5, 0.08]))


@onnx_op("LpPool", since=2)
def lp_pool(b: Builder, x: Value, *, kernel_shape, p: int = 2, auto_pad: str = "NOTSET", ceil_mode: int = 0,
            dilations=None, pads=None, strides=None) -> Value:
    """ONNX LpPool-2/11/18: ``(sum over the window of |x|^p)^(1/p)``, as an AveragePool of ``|x|^p`` (padding counts
    as zeros) times the window size."""
    if p <= 0:
        raise KilnError(f"LpPool: p must be positive, got {p}")
    a = b.op("Abs", [x])
    powp = b.op("Mul", [a, a]) if p == 2 else b.op("Pow", [a, b.const(np.array(float(p)), dtype=x.dtype)])
    window = window_attrs(x, list(kernel_shape), strides, dilations, pads, auto_pad)
    avg = b.op("AveragePool", [powp], kernel_shape=tuple(kernel_shape), **window, ceil_mode=int(ceil_mode),
               count_include_pad=1)
    total = b.op("Mul", [avg, b.const(np.array(float(np.prod(kernel_shape))), dtype=x.dtype)])
    if p == 2:
        return b.op("Sqrt", [total])
    return b.op("Pow", [total, b.const(np.array(1.0 / p), dtype=x.dtype)])


@onnx_op("TensorScatter", since=24)
def tensor_scatter(b: Builder, past: Value, update: Value, write_indices: Value | None = None, *, axis: int = -2,
                   mode: str = "linear") -> Value:
    """ONNX TensorScatter-24: the KV-cache update, ``update``'s rows written into ``past`` along ``axis`` from row
    ``write_indices[b]`` of each batch entry (0 without it; modulo the cache's length in ``circular`` mode). A
    cache that is a model input nothing else reads is updated in place (kiln.passes.memory_plan.mark_in_place).

    Raises:
        KilnError: an unknown ``mode``, or ``axis`` 0 (the batch axis). ShapeError: ``update`` does not fit.
    """
    if mode not in ("linear", "circular"):
        raise KilnError(f"TensorScatter: unknown mode {mode!r}")
    ax = norm_axis(axis, len(past.shape))
    if ax == 0:
        raise KilnError("TensorScatter: axis 0 is the batch axis; the sequence axis must be another")
    return b.op("TensorScatter", [past, update] + ([write_indices] if write_indices is not None else []), axis=ax,
                mode=mode)
