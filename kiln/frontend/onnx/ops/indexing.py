"""Indexing and data-movement ONNX operators: Gather, GatherElements, Slice, Split, Expand, Tile, Pad, Trilu,
Range, ConstantOfShape, Size, DepthToSpace, SpaceToDepth, OneHot, CumSum, EyeLike.

Inputs that decide an output's shape (Slice's ``starts``, Expand's ``shape``, Pad's ``pads``...)
must be constants at compile time (ConstantInputError otherwise); shape computations on static
shapes are folded by the importer, so ``Shape -> Gather -> Concat`` chains qualify.
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value, dims_of, norm_axis, shape_array
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Value, check_constant_size


@onnx_op("Gather", since=1)
def gather(b: Builder, x: Value, indices: Value, *, axis: int = 0) -> Value:
    """ONNX Gather-1/11/13: ``take(x, indices, axis)``; negative indices count from the end.

    Raises ShapeError for non-integer indices; KilnError for an axis out of range.
    """
    return b.op("Gather", [x, indices], axis=norm_axis(axis, len(x.shape)))


@onnx_op("GatherElements", since=11)
def gather_elements(b: Builder, x: Value, indices: Value, *, axis: int = 0) -> Value:
    """ONNX GatherElements-11/13: ``take_along_axis(x, indices, axis)``."""
    return b.op("GatherElements", [x, indices], axis=norm_axis(axis, len(x.shape)))


def slice_attrs(shape, starts, ends, axes, steps) -> dict[str, tuple[int, ...]]:
    """Per-dim clamped ``starts``, ``ends``, ``steps`` of ONNX Slice-13 (numpy slicing semantics)."""
    rank = len(shape)
    st, en, sp = [0] * rank, list(shape), [1] * rank
    axes = list(range(len(starts))) if axes is None else [norm_axis(int(a), rank) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    for a, s, e, step in zip(axes, starts, ends, steps):
        if step == 0:
            raise KilnError("Slice: steps must not be 0")
        d = shape[a]
        if symbolic.is_symbolic(s) or symbolic.is_symbolic(e) or symbolic.is_symbolic(d):
            s, e = symbolic.clamp_slice(s, e, d, step)
            st[a], en[a], sp[a] = s, e, step
            continue
        s, e = int(s), int(e)
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = min(max(s, -1), d - 1), min(max(e, -1), d - 1)
        st[a], en[a], sp[a] = s, e, step
    return {"starts": tuple(st), "ends": tuple(en), "steps": tuple(sp)}


def _slice(b: Builder, x: Value, attrs) -> Value:
    if all(isinstance(s, int) and s == 0 and (e is d or e == d) and st == 1
           for s, e, st, d in zip(attrs["starts"], attrs["ends"], attrs["steps"], x.shape)):
        return x
    return b.op("Slice", [x], **attrs)


@onnx_op("Slice", since=1)
def slice_1(b: Builder, x: Value, *, starts, ends, axes=None) -> Value:
    """ONNX Slice-1: bounds as attributes."""
    return _slice(b, x, slice_attrs(x.shape, starts, ends, axes, None))


@onnx_op("Slice", since=10)
def slice_10(b: Builder, x: Value, starts: Value, ends: Value, axes: Value | None = None,
             steps: Value | None = None) -> Value:
    """ONNX Slice-10/11/13: bounds, axes and steps as constant inputs."""
    ax = None if axes is None else const_value(axes, "axes").reshape(-1).tolist()
    sp = None if steps is None else const_value(steps, "steps").tolist()
    return _slice(b, x, slice_attrs(x.shape, const_value(starts, "starts").tolist(),
                                    const_value(ends, "ends").tolist(), ax, sp))


def _split(b: Builder, x: Value, axis: int, sizes: list[int] | None, n: int) -> list[Value]:
    ax = norm_axis(axis, len(x.shape))
    d = x.shape[ax]
    if sizes is None:
        part = -(-d // n)
        sizes = [min(part, d - k * part) for k in range(n)]
    if sum(sizes) != d or min(sizes, default=0) < 0:
        raise ShapeError(f"Split: sizes {sizes} do not add up to dim {d} of {list(x.shape)}")
    outs, start = [], 0
    for s in sizes:
        starts = [start if i == ax else 0 for i in range(len(x.shape))]
        ends = [start + s if i == ax else x.shape[i] for i in range(len(x.shape))]
        outs.append(b.op("Slice", [x], starts=tuple(starts), ends=tuple(ends), steps=(1,) * len(x.shape)))
        start += s
    return outs


@onnx_op("Split", since=2)
def split_2(b: Builder, x: Value, *, axis: int = 0, split=None, _nout: int = 0) -> list[Value]:
    """ONNX Split-2/11: sizes as an attribute, or equal parts (one per output)."""
    return _split(b, x, axis, list(split) if split else None, _nout)


@onnx_op("Split", since=13)
def split_13(b: Builder, x: Value, split: Value | None = None, *, axis: int = 0, num_outputs: int | None = None,
             _nout: int = 0) -> list[Value]:
    """ONNX Split-13/18: sizes as a constant input, or ``num_outputs`` parts (the last may be smaller)."""
    sizes = None if split is None else const_value(split, "split").tolist()
    return _split(b, x, axis, sizes, int(num_outputs or _nout))


@onnx_op("Expand", since=8)
def expand(b: Builder, x: Value, shape: Value) -> Value:
    """ONNX Expand-8/13: broadcast ``x`` with ``shape`` (the result has the broadcast of both)."""
    return b.op("Expand", [x], shape=dims_of(const_value(shape, "shape").tolist()))


@onnx_op("Tile", since=6)
def tile(b: Builder, x: Value, repeats: Value) -> Value:
    """ONNX Tile-6/13: repeat ``x`` ``repeats[d]`` times along each dim."""
    return b.op("Tile", [x], repeats=tuple(int(r) for r in const_value(repeats, "repeats").tolist()))


def _pad(b: Builder, x: Value, pads, mode: str, value, axes=None) -> Value:
    rank = len(x.shape)
    pads = [int(p) for p in pads]
    if axes is not None:
        axes = [norm_axis(int(a), rank) for a in axes]
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[rank + a] = pads[k], pads[len(axes) + k]
        pads = full
    if len(pads) != 2 * rank:
        raise ShapeError(f"Pad: {len(pads)} pads for rank {rank}")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise KilnError(f"Pad: unknown mode {mode!r}")
    v = value.item() if isinstance(value, np.ndarray) else value
    return b.op("Pad", [x], pads=tuple(pads), mode=mode, value=v)


@onnx_op("Pad", since=2)
def pad_2(b: Builder, x: Value, *, pads, mode: str = "constant", value: float = 0.0) -> Value:
    """ONNX Pad-2: pads and value as attributes."""
    return _pad(b, x, pads, mode, float(value))


@onnx_op("Pad", since=11)
def pad_11(b: Builder, x: Value, pads: Value, value: Value | None = None, axes: Value | None = None, *,
           mode: str = "constant") -> Value:
    """ONNX Pad-11/13/18/19/21: pads, constant value and axes as constant inputs; modes constant/reflect/edge/wrap."""
    v = const_value(value, "constant_value").reshape(()) if value is not None and value.size else 0
    ax = None if axes is None else const_value(axes, "axes").reshape(-1).tolist()
    return _pad(b, x, const_value(pads, "pads").tolist(), mode, v, ax)


@onnx_op("Trilu", since=14)
def trilu(b: Builder, x: Value, k: Value | None = None, *, upper: int = 1) -> Value:
    """ONNX Trilu-14: upper or lower triangle of the last two dims, shifted by the constant ``k``."""
    kk = 0 if k is None else int(const_value(k, "k").reshape(()))
    return b.op("Trilu", [x], upper=int(upper), k=kk)


@onnx_op("Range", since=11)
def range_(b: Builder, start: Value, limit: Value, delta: Value) -> Value:
    """ONNX Range-11: ``arange(start, limit, delta)`` of constant scalars, folded to a constant; with a run-time
    dim in ``start`` or ``limit`` (integers, constant ``delta``) an ``Iota`` kernel of run-time length."""
    s, l_, d = (const_value(v, n).reshape(()) for v, n in ((start, "start"), (limit, "limit"), (delta, "delta")))
    if s.dtype == object or l_.dtype == object:
        return _range_runtime(b, s.item(), l_.item(), d, start.dtype)
    n = max(int(np.ceil((l_ - s) / d)), 0)
    check_constant_size("Range", b.scope, [(start.dtype, (n,))])
    return b.const((s + np.arange(n) * d).astype(s.dtype), name=b.scope)


def _range_runtime(b: Builder, s, limit, d: np.ndarray, dtype: str) -> Value:
    if d.dtype == object or dtype not in ("int32", "int64") or int(d) == 0:
        raise KilnError(f"Range with run-time dims needs integer start/limit and a constant non-zero delta, got "
                        f"{dtype} delta {d}")
    step = int(d)
    n = symbolic.slice_len_expr(s, limit, step)
    return b.op("Iota", [], shape=(n,), start=symbolic.simplify(s), delta=step, dtype=dtype)


@onnx_op("ConstantOfShape", since=9)
def constant_of_shape(b: Builder, shape: Value, *, value=None) -> Value:
    """ONNX ConstantOfShape-9/20/21: a constant tensor of the (constant) ``shape`` filled with ``value``."""
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    dims = dims_of(const_value(shape, "input").tolist())
    if not symbolic.is_static(dims):  # a run-time shape: the fill value broadcast by an Expand kernel
        return b.op("Expand", [b.const(fill[:1].reshape(()), name=b.scope)], shape=dims)
    check_constant_size("ConstantOfShape", b.scope, [(dtypes.from_numpy(fill.dtype), dims)])
    return b.const(np.full(dims, fill[0], dtype=fill.dtype), name=b.scope)


@onnx_op("Size", since=1)
def size(b: Builder, x: Value) -> Value:
    """ONNX Size-1/13/19: the element count as an int64 scalar constant (a size expression for run-time dims)."""
    return b.const(shape_array([x.size]).reshape(()), name=b.scope, dtype="int64")


@onnx_op("EyeLike", since=9)
def eye_like(b: Builder, x: Value, *, dtype: int | None = None, k: int = 0) -> Value:
    """ONNX EyeLike-9/22: a constant 2-D identity (shifted by ``k``) of ``x``'s shape."""
    dt = dtypes.from_onnx(dtype) if dtype is not None else x.dtype
    return b.const(np.eye(x.shape[0], x.shape[1], k=k, dtype=dtypes.NUMPY[dt]), name=b.scope)


@onnx_op("DepthToSpace", since=1)
def depth_to_space(b: Builder, x: Value, *, blocksize: int, mode: str = "DCR") -> Value:
    """ONNX DepthToSpace-1/11/13: a reshape, transpose and reshape (``DCR`` or ``CRD`` channel order)."""
    n, c, h, w = x.shape
    bs = int(blocksize)
    if mode == "DCR":
        t = transpose(b, _reshape(b, x, (n, bs, bs, c // bs**2, h, w)), (0, 3, 4, 1, 5, 2))
    else:
        t = transpose(b, _reshape(b, x, (n, c // bs**2, bs, bs, h, w)), (0, 1, 4, 2, 5, 3))
    return _reshape(b, t, (n, c // bs**2, h * bs, w * bs))


@onnx_op("SpaceToDepth", since=1)
def space_to_depth(b: Builder, x: Value, *, blocksize: int, mode: str = "DCR") -> Value:
    """ONNX SpaceToDepth-1/13/28: a reshape, transpose and reshape (``DCR`` or, from 28, ``CRD`` order)."""
    n, c, h, w = x.shape
    bs = int(blocksize)
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    t = transpose(b, _reshape(b, x, (n, c, h // bs, bs, w // bs, bs)), perm)
    return _reshape(b, t, (n, c * bs * bs, h // bs, w // bs))


@onnx_op("OneHot", since=9)
def one_hot(b: Builder, indices: Value, depth: Value, values: Value, *, axis: int = -1) -> Value:
    """ONNX OneHot-9/11: ``values[1]`` at each index along a new axis of constant size ``depth``, else ``values[0]``."""
    d = int(const_value(depth, "depth").reshape(()))
    return b.op("OneHot", [indices, values], depth=d, axis=norm_axis(axis, len(indices.shape) + 1))


@onnx_op("CumSum", since=11)
def cumsum(b: Builder, x: Value, axis: Value, *, exclusive: int = 0, reverse: int = 0) -> Value:
    """ONNX CumSum-11/14: running sum along the constant ``axis``."""
    ax = norm_axis(int(const_value(axis, "axis").reshape(())), len(x.shape))
    return b.op("CumSum", [x], axis=ax, exclusive=int(exclusive), reverse=int(reverse))


__all__ = ["slice_attrs"]
