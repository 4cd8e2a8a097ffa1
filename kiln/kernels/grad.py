"""Tensor expressions of the gradient primitives (:mod:`kiln.ir.ops_grad`), N-d versions of the eager
gradient kernels of :mod:`kiln.eager.functional` (``conv2d_weight_grad``, the pooling gradients)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.arith.expr import Expr, binop, const, reduce, reduce_axis, select
from kiln.te.compute import Tensor, compute


def conv_weight_grad(x: Tensor, g: Tensor, attrs: dict[str, Any], name: str = "conv_weight_grad") -> Tensor:
    """``gw[co, ci, k...] = sum_{n, o...} g[n, co, o...] x[n, grp(co) Cin_g + ci, o s - p + k d]`` (zero outside x)."""
    ws, grp = tuple(attrs["w_shape"]), attrs["group"]
    s, d, p = attrs["strides"], attrs["dilations"], attrs["pads"]
    nsp = len(ws) - 2
    cin_g, cout_g = ws[1], ws[0] // grp
    rn = reduce_axis(g.shape[0], "rn")
    ro = [reduce_axis(g.shape[2 + i], "ro") for i in range(nsp)]

    def body(co, ci, *k):
        cin = (co // cout_g) * cin_g + ci if grp > 1 else ci
        pos = [ro[i] * s[i] - p[i] + k[i] * d[i] for i in range(nsp)]
        inside: Expr = const(True, "bool")
        for i in range(nsp):
            if p[i] > 0:
                inside = inside & binop(">=", pos[i], 0)
            if (g.shape[2 + i] - 1) * s[i] - p[i] + (ws[2 + i] - 1) * d[i] >= x.shape[2 + i]:
                inside = inside & binop("<", pos[i], x.shape[2 + i])
        return reduce("sum", select(inside, x[(rn, cin, *pos)], 0.0) * g[(rn, co, *ro)], [rn, *ro])

    return compute(ws, body, name)


def window_gather(g: Tensor, x_shape: tuple[int, ...], attrs: dict[str, Any],
                  fn: Callable[[tuple, list[Expr], list], Expr], name: str) -> Tensor:
    """``out[n, c, x...]`` = sum over the pooling windows ``o`` that contain ``x`` at kernel offset ``k``
    (``o s - p + k d = x``) of ``fn((n, c), o, k)``: the transpose of a pooling window's gather."""
    k, s, d, p = attrs["kernel_shape"], attrs["strides"], attrs["dilations"], attrs["pads"]
    nsp = len(x_shape) - 2
    rk = [reduce_axis(k[i], "rk") for i in range(nsp)]

    def body(n, c, *xi):
        ok: Expr = const(True, "bool")
        pos = []
        for i in range(nsp):
            u = xi[i] + p[i] - rk[i] * d[i]
            q = u // s[i] if s[i] > 1 else u
            ok = ok & binop(">=", u, 0) & binop("<", q, g.shape[2 + i])
            if s[i] > 1:
                ok = ok & binop("==", u % s[i], 0)
            pos.append(q)
        return reduce("sum", select(ok, fn((n, c), pos, rk), 0.0), rk)

    return compute(tuple(x_shape), body, name)


def pool_grad_sum(g: Tensor, attrs: dict[str, Any], name: str = "pool_grad_sum") -> Tensor:
    """PoolGradSum: each input element sums ``g`` over the windows containing it."""
    return window_gather(g, tuple(attrs["x_shape"]), attrs, lambda nc, o, k: g[(*nc, *o)], name)


def maxpool_arg_window(x: Tensor, y: Tensor, attrs: dict[str, Any], name: str = "maxpool_argwin") -> Tensor:
    """MaxPoolArgWindow: the flat kernel offset of each window's first element equal to its maximum ``y``."""
    k, s, d, p = attrs["kernel_shape"], attrs["strides"], attrs["dilations"], attrs["pads"]
    nsp = len(k)
    rk = [reduce_axis(k[i], "rk") for i in range(nsp)]
    size = 1
    for e in k:
        size *= e

    def body(n, c, *o):
        inside: Expr = const(True, "bool")
        pos = []
        for i in range(nsp):
            t = o[i] * s[i] - p[i] + rk[i] * d[i]
            inside = inside & binop(">=", t, 0) & binop("<", t, x.shape[2 + i])
            pos.append(t)
        flat: Expr = rk[0]
        for i in range(1, nsp):
            flat = flat * k[i] + rk[i]
        hit = select(inside, binop("==", x[(n, c, *pos)], y[(n, c, *o)]), const(False, "bool"))
        return reduce("min", select(hit, flat, const(size, "int32")), rk)

    return compute(tuple(y.shape), body, name)


def maxpool_grad(g: Tensor, win: Tensor, attrs: dict[str, Any], name: str = "maxpool_grad") -> Tensor:
    """MaxPoolGrad: each input element sums ``g`` over the windows it won (offset ``win``)."""
    k = attrs["kernel_shape"]

    def fn(nc, o, rk):
        flat: Expr = rk[0]
        for i in range(1, len(k)):
            flat = flat * k[i] + rk[i]
        return select(binop("==", win[(*nc, *o)], flat), g[(*nc, *o)], 0.0)

    return window_gather(g, tuple(attrs["x_shape"]), attrs, fn, name)
