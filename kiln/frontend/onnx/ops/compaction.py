"""ONNX operators with data-dependent output shapes: NonZero, Compress on a run-time condition, Unique, TopK with a
run-time ``k`` (docs/dynamic-shapes.md, *Data-dependent shapes*).

Each is a stream compaction: a ``keep`` flag per element or slice, its exclusive prefix count ``pos`` (where each
kept one lands), and the total, which becomes a *data-dependent run-time dim* (:meth:`Builder.data_dim`): the
runtimes read it back once, after the kernel that computes it, bind the dim and size every later dispatch and
shape from it. Buffers are planned for the upper bound shape inference gives (every element kept).
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ShapeError
from kiln.frontend.onnx.ops.common import const_value, norm_axis, shape_array
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape, transpose
from kiln.ir.graph import Builder, Value

#: flags counted per row of the two-level prefix count: a CumSum loops over its axis for each output element, so
#: counting ``n`` flags in one row costs ``n^2`` steps and in rows of ``ROW`` about ``n * ROW + (n / ROW)^2``
ROW = 256


def prefix_count(b: Builder, keep: Value) -> tuple[Value, Value]:
    """``(pos, count)`` of int32 flags ``keep`` ``[n]``: ``pos[j]`` the number of non-zero flags before ``j`` (an
    exclusive prefix sum, int32 ``[n]``) and ``count`` their total (int32 ``[1]``). Flags beyond :data:`ROW` are
    counted in rows of ``ROW`` (a CumSum per row, then one over the rows' totals)."""
    n = keep.shape[0]
    if symbolic.is_symbolic(n) or n <= 2 * ROW:
        pos = b.op("CumSum", [keep], axis=0, exclusive=1, reverse=0)
        return pos, b.op("ReduceSum", [keep], axes=(0,), keepdims=1)
    rows = -(-n // ROW)
    padded = b.op("Pad", [keep], pads=(0, rows * ROW - n), mode="constant", value=0) if rows * ROW != n else keep
    grid = reshape(b, padded, (rows, ROW))
    inside = b.op("CumSum", [grid], axis=1, exclusive=1, reverse=0)
    totals = b.op("ReduceSum", [grid], axes=(1,), keepdims=1)  # [rows, 1]
    before = b.op("CumSum", [totals], axis=0, exclusive=1, reverse=0)
    pos = reshape(b, b.op("Add", [inside, before]), (rows * ROW,))
    if rows * ROW != n:
        pos = b.op("Slice", [pos], starts=(0,), ends=(n,), steps=(1,))
    return pos, b.op("ReduceSum", [reshape(b, totals, (rows,))], axes=(0,), keepdims=1)


def compact(b: Builder, data: Value, keep: Value, axis: int, hint: str, most=None) -> Value:
    """``data``'s slices along ``axis`` whose int32 flag in ``keep`` (``[data.shape[axis]]``) is non-zero, in order:
    a ``Compact`` whose extent along ``axis`` is a new data-dependent dim named after ``hint``, at most ``most``
    (default: every slice kept)."""
    pos, count = prefix_count(b, keep)
    dim = b.data_dim(count, data.shape[axis] if most is None else most, hint)
    return b.op("Compact", [data, keep, pos], axis=axis, count=dim)


def _flags(b: Builder, x: Value) -> Value:
    """int32 ``x != 0`` (NaN counts as non-zero, as numpy's nonzero has it)."""
    if x.dtype == "bool":
        return b.op("Cast", [x], to="int32")
    zero = b.op("Cast", [b.const(np.zeros((), np.int32))], to=x.dtype)  # (folds to a constant)
    return b.op("Cast", [b.op("Not", [b.op("Equal", [x, zero])])], to="int32")


@onnx_op("NonZero", since=9)
def nonzero(b: Builder, x: Value) -> Value:
    """ONNX NonZero-9/13: the int64 indices ``[rank, n]`` of the non-zero elements of ``x`` in row-major order,
    ``n`` a data-dependent dim (at most ``x``'s size); a constant ``x`` folds."""
    if not x.shape:
        raise ShapeError("NonZero: the input is a scalar (rank 0); Kiln needs rank >= 1")
    if x.is_const and symbolic.is_static(x.shape):
        return b.const(np.array(np.nonzero(x.const), dtype=np.int64).reshape(len(x.shape), -1), name=b.scope)
    shape = tuple(x.shape)
    n = symbolic.prod(shape)
    keep = reshape(b, _flags(b, x), (n,))
    iota = b.op("Iota", [], shape=(n,), start=0, delta=1, dtype="int32") if symbolic.is_symbolic(n) else \
        b.const(np.arange(n, dtype=np.int32))
    coords = []
    for axis in range(len(shape)):  # row-major coordinates of each flat index
        inner = symbolic.prod(shape[axis + 1:])
        c = iota if symbolic.is_static([inner]) and inner == 1 else b.op("Div", [iota, _scalar(b, inner)])
        if axis > 0:
            c = b.op("Mod", [c, _scalar(b, shape[axis])], fmod=0)
        coords.append(reshape(b, c, (1, n)))
    grid = coords[0] if len(coords) == 1 else b.op("Concat", coords, axis=0)
    return compact(b, b.op("Cast", [grid], to="int64"), keep, 1, f"{b.scope or 'NonZero'}.count")


def _along(b: Builder, x: Value, axis: int | None) -> tuple[Value, int]:
    """``(x, axis)`` normalised, or ``x`` flattened and axis 0 when ``axis`` is None (Compress, Unique)."""
    if axis is None:
        return reshape(b, x, (symbolic.prod(x.shape),)), 0
    return x, norm_axis(axis, len(x.shape))


def _scalar(b: Builder, d) -> Value:
    """An int32 scalar of ``d`` (an int or a size expression, read from the dims at run time)."""
    return b.const(np.int32(d)) if symbolic.is_static([d]) else b.const(shape_array([d]).reshape(()), dtype="int32")


@onnx_op("Compress", since=9)
def compress(b: Builder, x: Value, condition: Value, *, axis: int | None = None) -> Value:
    """ONNX Compress-9/11: the slices of ``x`` along ``axis`` (of x flattened when None) where ``condition``
    is true; a condition shorter than the axis selects among its first elements. A constant condition is a Gather
    at constant indices; a run-time one a compaction whose extent is a data-dependent dim.

    Raises:
        ShapeError: the condition is longer than the axis or not 1-D.
    """
    x, ax = _along(b, x, axis)
    extent = x.shape[ax]
    if len(condition.shape) != 1:
        raise ShapeError(f"Compress: condition must be 1-D, got {symbolic.format_shape(condition.shape)}")
    length = condition.shape[0]
    if symbolic.is_static([length, extent]) and length > extent:
        raise ShapeError(f"Compress: condition of {length} elements is longer than axis {ax} ({extent})")
    if condition.is_const:
        cond = np.asarray(const_value(condition, "condition")).astype(bool).ravel()
        return b.op("Gather", [x, b.const(np.flatnonzero(cond).astype(np.int64))], axis=ax)
    keep = b.op("Cast", [condition], to="int32")
    if length != extent:  # (structurally: a run-time length must be the axis's own dim)
        if not symbolic.is_static([length, extent]):
            raise ShapeError(f"Compress: a condition of run-time length {symbolic.to_text(length)} must span axis "
                             f"{ax} ({symbolic.to_text(extent)})")
        keep = b.op("Pad", [keep], pads=(0, extent - length), mode="constant", value=0)
    return compact(b, x, keep, ax, f"{b.scope or 'Compress'}.count")


def topk_count(b: Builder, k: Value, extent) -> object:
    """The data-dependent dim of TopK's run-time ``k`` (an integer ``[1]`` or scalar value), at most ``extent``; the
    runtimes refuse a ``k`` outside ``[0, extent]`` (ONNX TopK requires ``k <= extent``)."""
    count = b.op("Cast", [reshape(b, k, (1,))], to="int32")
    return b.data_dim(count, extent, f"{b.scope or 'TopK'}.k")


@onnx_op("Unique", since=11)
def unique(b: Builder, x: Value, *, axis: int | None = None, sorted: int = 1) -> list[Value]:
    """ONNX Unique-11: the distinct elements of ``x`` (slices along ``axis``; of x flattened when None), in ascending
    order (``sorted=1``; slices lexicographically) or in order of first occurrence, with the index of each one's first
    occurrence, each element's index in the result (``inverse_indices``) and the counts.

    Slices are compared pairwise (``O(n^2 m)`` for ``n`` slices of ``m`` elements, no sort): a slice is *first* when
    no earlier slice equals it, its place in the result is the number of first slices that are smaller (sorted) or
    that come before its first occurrence, and the number of first slices is the data-dependent extent of ``Y``,
    ``indices`` and ``counts``, written by one ``Compact`` each.

    Raises:
        ShapeError: ``x`` has a run-time extent along the compared axis.
    """
    x, ax = _along(b, x, axis)
    n = x.shape[ax]
    rest = [d for i, d in enumerate(x.shape) if i != ax]
    if not symbolic.is_static([n, *rest]):
        raise ShapeError(f"Unique: input {symbolic.format_shape(x.shape)} must have a static shape")
    m = int(np.prod(rest, dtype=np.int64))
    perm = [ax] + [i for i in range(len(x.shape)) if i != ax]
    rows = reshape(b, transpose(b, x, perm), (n, m))  # slice i is row i
    a, c = reshape(b, rows, (n, 1, m)), reshape(b, rows, (1, n, m))
    differ = b.op("Cast", [b.op("Not", [b.op("Equal", [a, c])])], to="int32")  # [i, j, e]
    equal = b.op("Sub", [b.const(np.int32(1)), b.op("ReduceMax", [differ], axes=(2,), keepdims=0)])  # [i, j]
    i_idx = b.const(np.arange(n, dtype=np.int32).reshape(n, 1))
    j_idx = b.const(np.arange(n, dtype=np.int32).reshape(1, n))
    earlier = b.op("Cast", [b.op("Less", [j_idx, i_idx])], to="int32")  # j < i
    first = b.op("Sub", [b.const(np.int32(1)), b.op("ReduceMax", [b.op("Mul", [equal, earlier])], axes=(1,),
                                                                 keepdims=0)])  # [n]: no earlier equal slice
    counts = b.op("ReduceSum", [equal], axes=(1,), keepdims=0)
    if sorted:  # slice j < slice i lexicographically: at their first differing element
        if m == 1:
            before = b.op("Less", [reshape(b, rows, (1, n)), reshape(b, rows, (n, 1))])
        else:
            e_idx = b.const(np.arange(m, dtype=np.int32).reshape(1, 1, m))
            at = b.op("ReduceMin", [b.op("Where", [b.op("Cast", [differ], to="bool"), e_idx, b.const(np.int32(m))])],
                      axes=(2,), keepdims=0)  # [i, j], m where equal
            col = b.op("Min", [at, b.const(np.int32(m - 1))])
            flat = reshape(b, rows, (n * m,))
            xi = b.op("Gather", [flat, b.op("Add", [b.op("Mul", [i_idx, b.const(np.int32(m))]), col])], axis=0)
            xj = b.op("Gather", [flat, b.op("Add", [b.op("Mul", [j_idx, b.const(np.int32(m))]), col])], axis=0)
            before = b.op("And", [b.op("Less", [at, b.const(np.int32(m))]), b.op("Less", [xj, xi])])
    else:  # j's first occurrence comes before i's
        start = b.op("ReduceMin", [b.op("Where", [b.op("Cast", [equal], to="bool"), j_idx, b.const(np.int32(n))])],
                     axes=(1,), keepdims=1)  # [n, 1]: the first occurrence of slice i
        before = b.op("Less", [j_idx, start])
    place = b.op("ReduceSum", [b.op("Mul", [reshape(b, first, (1, n)), b.op("Cast", [before], to="int32")])],
                 axes=(1,), keepdims=0)  # [n]: each slice's index in Y
    total = b.op("ReduceSum", [first], axes=(0,), keepdims=1)
    dim = b.data_dim(total, n, f"{b.scope or 'Unique'}.count")
    y = b.op("Compact", [rows, first, place], axis=0, count=dim)
    y = reshape(b, y, (dim, *rest))
    y = transpose(b, y, [perm.index(i) for i in range(len(perm))])
    indices = b.op("Compact", [b.const(np.arange(n, dtype=np.int64)), first, place], axis=0, count=dim)
    counts = b.op("Compact", [b.op("Cast", [counts], to="int64"), first, place], axis=0, count=dim)
    return [y, indices, b.op("Cast", [place], to="int64"), counts]
