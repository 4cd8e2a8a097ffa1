"""Tensor expressions of Resize, GridSample and ConvTranspose (semantics in :mod:`kiln.ir.ops_resample`)."""

from __future__ import annotations

from typing import Any

from kiln.arith.expr import Expr, binop, call, cast, const, reduce, reduce_axis, select
from kiln.ir.ops_resample import MathOps, grid_coord, grid_taps, resize_taps, resized_axes
from kiln.te.compute import Tensor, compute

#: the sampling math of :func:`kiln.ir.ops_resample.resize_taps` over expressions
EXPR_OPS = MathOps(
    floor=lambda x: call("floor", x),
    ceil=lambda x: call("ceil", x),
    where=lambda c, t, f: select(c, t, f),
    less=lambda a, b: binop("<", a, b),
    to_int=lambda x: cast(x, "int32"),
    clamp=lambda x, lo, hi: call("clamp", x, lo, hi),
    to_float=lambda x: cast(x, "float32"),
    logical_or=lambda a, b: binop("||", a, b),
    rint=lambda x: call("round", x),  # WGSL round: half to even, as numpy's rint
)


def grid_coords(grid: Tensor, attrs: dict[str, Any], name: str = "grid_coords") -> Tensor:
    """Source coordinates of GridSample (denormalised, rounded, clamped or reflected), spatial dims in input order.

    A kernel of its own, so the sampling kernel reads each coordinate once instead of repeating its expression.
    """
    n = grid.shape[-1]

    def body(*o):
        cols = [grid_coord(EXPR_OPS, grid[(*o[:-1], n - 1 - d)], attrs["sizes"][d], attrs) for d in range(n)]
        val = cols[-1]
        for d in range(n - 2, -1, -1):
            val = select(binop("==", o[-1], d), cols[d], val)
        return val

    return compute(grid.shape, body, name)


def grid_sample(x: Tensor, coords: Tensor, attrs: dict[str, Any], out_shape, name: str = "grid_sample") -> Tensor:
    """ONNX GridSample-22 (nearest, linear, cubic; zeros, border, reflection padding) over N-d spatial inputs,
    reading the source coordinates from :func:`grid_coords`."""
    nsp = len(x.shape) - 2

    def body(n, c, *o):
        per_axis = [grid_taps(EXPR_OPS, coords[(n, *o, d)], x.shape[2 + d], attrs) for d in range(nsp)]
        total: Expr | None = None

        def visit(d: int, idx: list, weight):
            nonlocal total
            if d == nsp:
                v = x[(n, c, *idx)]
                v = v if weight is None else v * weight
                total = v if total is None else total + v
                return
            for i, w, valid in per_axis[d]:
                ww = weight
                for f in (w, valid):
                    if f is not None:
                        ww = f if ww is None else ww * f
                visit(d + 1, [*idx, i], ww)

        visit(0, [], None)
        return total

    return compute(out_shape, body, name)


def resize(x: Tensor, attrs: dict[str, Any], out_shape, name: str = "resize") -> Tensor:
    """ONNX Resize-10/11/13/18/19 (nearest, linear, cubic): a weighted sum of input taps per output element."""
    axes = resized_axes(x.shape, attrs)

    def body(*o):
        per_axis = [resize_taps(EXPR_OPS, cast(o[d], "float32"), x.shape[d], out_shape[d], attrs["scales"][d], attrs)
                    for d in axes]
        total: Expr | None = None

        def visit(k: int, idx: list, weight):
            nonlocal total
            if k == len(axes):
                v = x[tuple(idx)]
                if weight is not None:
                    v = cast(v, "float32") * weight if x.dtype != "float32" else v * weight
                total = v if total is None else total + v
                return
            for i, w in per_axis[k]:
                nxt = list(idx)
                nxt[axes[k]] = i
                visit(k + 1, nxt, w if weight is None else (weight if w is None else weight * w))

        visit(0, list(o), None)
        return cast(total, x.dtype) if total.dtype != x.dtype else total

    return compute(out_shape, body, name)


def conv_transpose(x: Tensor, w: Tensor, attrs: dict[str, Any], out_shape, name: str = "conv_transpose") -> Tensor:
    """ONNX ConvTranspose-11 as a gather: ``out[n, co, o] = sum x[n, ci, i] w[ci, co', k]`` over ``i s - p + k d = o``."""
    nsp = len(x.shape) - 2
    g, s, d, p = attrs["group"], attrs["strides"], attrs["dilations"], attrs["pads"]
    cin_g, cout_g = x.shape[1] // g, w.shape[1]
    rc = reduce_axis(cin_g, "rc")
    rk = [reduce_axis(w.shape[2 + i], "rk") for i in range(nsp)]

    def body(n, co, *o):
        grp = co // cout_g if g > 1 else 0
        ci = grp * cin_g + rc if g > 1 else rc
        inside: Expr = const(True, "bool")
        pos = []
        for i in range(nsp):
            t = o[i] + p[i] - rk[i] * d[i]
            q = t // s[i] if s[i] > 1 else t
            inside = inside & binop(">=", t, 0) & binop("<", q, x.shape[2 + i])
            if s[i] > 1:
                inside = inside & binop("==", t % s[i], 0)
            pos.append(q)
        wv = w[(ci, co % cout_g if g > 1 else co, *rk)]
        return reduce("sum", select(inside, x[(n, ci, *pos)], 0.0) * wv, [rc, *rk])

    return compute(out_shape, body, name)
