"""Gradient primitives: ops that only reverse-mode autodiff (:mod:`kiln.passes.autodiff`) emits.

Registered into :mod:`kiln.ir.registry` (importing that module imports this one), with shape rules and
numpy semantics like every primitive; their tensor expressions are in :mod:`kiln.kernels.grad`.

- ``ConvWeightGrad(x, g)``: the gradient of ``Conv(x, w)`` with respect to ``w`` for an upstream
  gradient ``g`` (attrs of the Conv plus ``w_shape``):
  ``gw[co, ci, k...] = sum_{n, o...} g[n, co, o...] * x[n, grp(co) * Cin_g + ci, o*s - p + k*d]``.
  (The gradient with respect to ``x`` is the existing ``ConvTranspose`` primitive.)
- ``PoolGradSum(g)``: the adjoint of a pooling window's gather: every input element sums ``g`` over
  the windows that contain it (attrs of the pool plus ``x_shape``). AveragePool's gradient is this of
  ``g`` divided by each window's count.
- ``MaxPoolArgWindow(x, y)``: for each output of ``MaxPool(x) = y``, the flat kernel offset of the
  window's *first* element equal to the maximum (``int32``); ``MaxPoolGrad(g, win)``: each input element
  sums ``g`` over the windows whose winning offset is its own (PyTorch's max-pooling gradient).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.ir.registry import register


def _windows(x: np.ndarray, kernel, strides, dilations, pads, out_sp, fill: float = 0.0) -> np.ndarray:
    """``win[n, c, o..., k...] = x[n, c, o*s - p + k*d]`` (``fill`` outside the input), float64."""
    nsp = x.ndim - 2
    win = np.full((*x.shape[:2], *out_sp, *kernel), fill, np.float64)
    for offs in np.ndindex(*kernel):
        idx, ok = [], np.ones(out_sp, bool)
        for i in range(nsp):
            pos = np.arange(out_sp[i]) * strides[i] - pads[i] + offs[i] * dilations[i]
            shape = [1] * nsp
            shape[i] = -1
            ok = ok & ((pos >= 0) & (pos < x.shape[2 + i])).reshape(shape)
            idx.append(np.clip(pos, 0, x.shape[2 + i] - 1))
        vals = x[(slice(None), slice(None)) + np.ix_(*idx)]
        win[(Ellipsis, *offs)] = np.where(ok, vals, fill)
    return win


def _scatter_windows(contrib: np.ndarray, x_shape, kernel, strides, dilations, pads) -> np.ndarray:
    """The adjoint of :func:`_windows`: ``contrib[n, c, o..., k...]`` added into an array of ``x_shape``."""
    nsp = len(x_shape) - 2
    out_sp = contrib.shape[2:2 + nsp]
    out = np.zeros(x_shape, np.float64)
    for offs in np.ndindex(*kernel):
        for o in np.ndindex(*out_sp):
            pos = [o[i] * strides[i] - pads[i] + offs[i] * dilations[i] for i in range(nsp)]
            if all(0 <= pos[i] < x_shape[2 + i] for i in range(nsp)):
                out[(slice(None), slice(None), *pos)] += contrib[(slice(None), slice(None), *o, *offs)]
    return out


# ----------------------------------------------------------------------------- ConvWeightGrad
def _conv_wgrad_infer(ts, a):
    (dx, sx), (_dg, sg) = ts
    ws = tuple(a["w_shape"])
    g = a["group"]
    if len(sx) != len(sg) or len(ws) != len(sx) or sx[0] != sg[0] or sg[1] != ws[0] or sx[1] != ws[1] * g:
        raise ShapeError(f"ConvWeightGrad: input {list(sx)}, gradient {list(sg)} and weight shape {list(ws)} "
                         "do not fit")
    return [(dx, ws)]


def _conv_wgrad_eval(xs, a):
    x, g = xs
    ws, grp = tuple(a["w_shape"]), a["group"]
    win = _windows(x.astype(np.float64), ws[2:], a["strides"], a["dilations"], a["pads"], g.shape[2:])
    cin_g, cout_g = ws[1], ws[0] // grp
    nsp = x.ndim - 2
    sp, ks = "hijk"[:nsp], "pqrs"[:nsp]
    parts = [np.einsum(f"no{sp},nc{sp}{ks}->oc{ks}", g[:, q * cout_g:(q + 1) * cout_g].astype(np.float64),
                       win[:, q * cin_g:(q + 1) * cin_g], optimize=True) for q in range(grp)]
    return [np.concatenate(parts, axis=0).astype(x.dtype)]


register("ConvWeightGrad", "conv", _conv_wgrad_infer, _conv_wgrad_eval)


# ----------------------------------------------------------------------------- pooling gradients
def _pool_grad_infer(ts, a):
    (dg, sg) = ts[0]
    xs = tuple(a["x_shape"])
    if len(xs) != len(sg) or tuple(xs[:2]) != tuple(sg[:2]):
        raise ShapeError(f"{a.get('_op', 'pool gradient')}: gradient {list(sg)} does not fit input shape {list(xs)}")
    return [(dg, xs)]


def _pool_grad_sum_eval(xs, a):
    g, = xs
    nsp = g.ndim - 2
    contrib = np.broadcast_to(g.astype(np.float64).reshape(*g.shape, *([1] * nsp)), (*g.shape, *a["kernel_shape"]))
    return [_scatter_windows(contrib, a["x_shape"], a["kernel_shape"], a["strides"], a["dilations"],
                             a["pads"]).astype(g.dtype)]


register("PoolGradSum", "pool_grad", _pool_grad_infer, _pool_grad_sum_eval)


def _argwin_infer(ts, a):
    (_, sx), (_, sy) = ts
    if len(sx) != len(sy) or tuple(sx[:2]) != tuple(sy[:2]):
        raise ShapeError(f"MaxPoolArgWindow: input {list(sx)} and pooled {list(sy)} do not fit")
    return [("int32", tuple(sy))]


def _argwin_eval(xs, a):
    x, y = xs
    k = a["kernel_shape"]
    win = _windows(x.astype(np.float64), k, a["strides"], a["dilations"], a["pads"], y.shape[2:], fill=np.nan)
    flat = win.reshape(*y.shape, -1)
    hit = flat == y.astype(np.float64)[..., None]
    size = int(np.prod(k))
    return [np.where(hit.any(-1), hit.argmax(-1), size).astype(np.int32)]


register("MaxPoolArgWindow", "pool_grad", _argwin_infer, _argwin_eval)


def _maxpool_grad_eval(xs, a):
    g, win = xs
    k = a["kernel_shape"]
    size = int(np.prod(k))
    onehot = (win[..., None] == np.arange(size)).reshape(*win.shape, *k)
    contrib = np.where(onehot, g.astype(np.float64)[(Ellipsis, *([None] * len(k)))], 0.0)
    return [_scatter_windows(contrib, a["x_shape"], k, a["strides"], a["dilations"], a["pads"]).astype(g.dtype)]


register("MaxPoolGrad", "pool_grad", _pool_grad_infer, _maxpool_grad_eval)
