"""Shape and layout ONNX operators: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Shape; and control
flow that unrolls at compile time: If (constant condition), Scan."""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value, norm_axis, shape_array
from kiln.frontend.onnx.ops.control import runtime_if
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def resolve_reshape(src: tuple[int, ...], shape: list[int], allowzero: int = 0) -> tuple[int, ...]:
    """ONNX Reshape's target shape: 0 copies the input dim (unless ``allowzero``), one -1 is inferred."""
    if not symbolic.is_static(src) or not symbolic.is_static(shape):
        return symbolic.resolve_reshape(src, shape, allowzero)
    out = [src[i] if (d == 0 and not allowzero) else int(d) for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise ShapeError(f"Reshape: more than one -1 in {shape}")
    total = int(np.prod(src, dtype=np.int64))
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"Reshape: cannot reshape {list(src)} to {shape}")
        out[out.index(-1)] = total // known
    if int(np.prod(out, dtype=np.int64)) != total:
        raise ShapeError(f"Reshape: cannot reshape {list(src)} to {shape}")
    return tuple(out)


@onnx_op("Reshape", since=5)
def reshape(b: Builder, x: Value, shape: Value, *, allowzero: int = 0) -> Value:
    """ONNX Reshape-5/13/14 with a constant target shape."""
    return _reshape(b, x, resolve_reshape(x.shape, const_value(shape, "shape").tolist(), allowzero))


@onnx_op("Flatten", since=1)
def flatten(b: Builder, x: Value, *, axis: int = 1) -> Value:
    """ONNX Flatten-1/9/11/13: 2-D view [prod(dims[:axis]), prod(dims[axis:])]."""
    rank = len(x.shape)
    if not -rank <= axis <= rank:
        raise ShapeError(f"Flatten: axis {axis} is out of range for rank {rank}")
    ax = axis + rank if axis < 0 else axis
    return _reshape(b, x, (symbolic.prod(x.shape[:ax]), symbolic.prod(x.shape[ax:])))


def _squeeze(b: Builder, x: Value, axes) -> Value:
    rank = len(x.shape)
    axes = [norm_axis(a, rank) for a in axes] if axes is not None else [i for i, d in enumerate(x.shape) if d == 1]
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"Squeeze: dim {a} of {list(x.shape)} is not 1")
    return _reshape(b, x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _unsqueeze(b: Builder, x: Value, axes) -> Value:
    rank = len(x.shape) + len(axes)
    axes = sorted(norm_axis(a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return _reshape(b, x, tuple(shape))


@onnx_op("Squeeze", since=1)
def squeeze_1(b: Builder, x: Value, *, axes=None) -> Value:
    """ONNX Squeeze-1/11: axes as attribute."""
    return _squeeze(b, x, axes)


@onnx_op("Squeeze", since=13)
def squeeze_13(b: Builder, x: Value, axes: Value | None = None) -> Value:
    """ONNX Squeeze-13: axes as an optional constant input."""
    return _squeeze(b, x, None if axes is None else const_value(axes, "axes").reshape(-1).tolist())


@onnx_op("Unsqueeze", since=1)
def unsqueeze_1(b: Builder, x: Value, *, axes) -> Value:
    """ONNX Unsqueeze-1/11: axes as attribute."""
    return _unsqueeze(b, x, axes)


@onnx_op("Unsqueeze", since=13)
def unsqueeze_13(b: Builder, x: Value, axes: Value) -> Value:
    """ONNX Unsqueeze-13: axes as a constant input."""
    return _unsqueeze(b, x, const_value(axes, "axes").reshape(-1).tolist())


@onnx_op("Transpose", since=1)
def transpose_1(b: Builder, x: Value, *, perm=None) -> Value:
    """ONNX Transpose-1/13: permute axes (reverse by default)."""
    perm = list(perm) if perm is not None else list(range(len(x.shape)))[::-1]
    return transpose(b, x, tuple(perm))


@onnx_op("Concat", since=4)
def concat(b: Builder, *xs: Value, axis: int) -> Value:
    """ONNX Concat-4/11/13: join along ``axis`` (constants folded at compile time)."""
    ax = norm_axis(axis, len(xs[0].shape))
    xs = [x for x in xs if x.shape[ax] != 0] or list(xs[:1])
    if all(x.is_const for x in xs):
        return b.const(np.concatenate([x.const for x in xs], axis=ax), name=b.scope)
    if len(xs) == 1:
        return xs[0]
    return b.op("Concat", list(xs), axis=ax)


@onnx_op("Shape", since=1)
def shape(b: Builder, x: Value, *, start: int = 0, end: int | None = None) -> Value:
    """ONNX Shape-1/15: the shape as an int64 constant (an object array of size expressions for run-time dims)."""
    return b.const(shape_array(x.shape[start:end]), name=b.scope, dtype="int64")


@onnx_op("If", since=1)
def if_(b: Builder, cond: Value, *, then_branch, else_branch) -> list[Value]:
    """ONNX If-1/11/13/16/19/21. A condition known at compile time: the taken branch is converted inline.
    A condition computed at run time: both branches become sub-graphs of an IR ``If`` node
    (:func:`kiln.frontend.onnx.ops.control.runtime_if`).
    """
    if cond is not None and not cond.is_const:
        return runtime_if(b, cond, then_branch, else_branch)
    taken = then_branch if bool(const_value(cond, "cond").reshape(-1)[0]) else else_branch
    return b.subgraph(taken)


@onnx_op("Scan", since=9)
def scan(b: Builder, *inputs: Value, body, num_scan_inputs: int, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None) -> list[Value]:
    """ONNX Scan-9/11/16/19/21/23, unrolled over the (static) scan length: the body runs once per step on the
    state values and one slice of each scan input; its scan outputs are stacked along ``scan_output_axes``.

    Raises KilnError for scan inputs of different lengths.
    """
    m = int(num_scan_inputs)
    states, xs = list(inputs[:len(inputs) - m]), list(inputs[len(inputs) - m:])
    in_axes = [norm_axis(a, len(x.shape)) for a, x in zip(scan_input_axes or [0] * m, xs)]
    in_dirs = list(scan_input_directions or [0] * m)
    lengths = {x.shape[a] for x, a in zip(xs, in_axes)}
    if len(lengths) != 1:
        raise KilnError(f"Scan: scan inputs have different lengths {sorted(lengths)}")
    steps = lengths.pop()
    n_scan_out = len(body.output) - len(states)
    per_step: list[list[Value]] = [[] for _ in range(n_scan_out)]
    for t in range(steps):
        slices = []
        for x, a, d in zip(xs, in_axes, in_dirs):
            i = steps - 1 - t if d else t
            starts = tuple(i if k == a else 0 for k in range(len(x.shape)))
            ends = tuple(i + 1 if k == a else n for k, n in enumerate(x.shape))
            s = b.op("Slice", [x], starts=starts, ends=ends, steps=(1,) * len(x.shape))
            slices.append(_reshape(b, s, tuple(n for k, n in enumerate(x.shape) if k != a)))
        outs = b.subgraph(body, [*states, *slices])
        states = outs[:len(states)]
        for k, v in enumerate(outs[len(states):]):
            per_step[k].append(v)
    out_axes = list(scan_output_axes or [0] * n_scan_out)
    out_dirs = list(scan_output_directions or [0] * n_scan_out)
    stacked = []
    for k, vals in enumerate(per_step):
        if out_dirs[k]:
            vals = vals[::-1]
        rank = len(vals[0].shape) + 1
        a = norm_axis(out_axes[k], rank)
        parts = [_reshape(b, v, (*v.shape[:a], 1, *v.shape[a:])) for v in vals]
        stacked.append(parts[0] if len(parts) == 1 else b.op("Concat", parts, axis=a))
    return [*states, *stacked]
