"""Primitive ops of the graph IR: their shape rules and numpy semantics.

This module is the executable specification of every primitive: ``infer`` gives
output dtypes and shapes, ``evaluate`` computes outputs with numpy. The
interpreter (:mod:`kiln.ir.interp`) runs graphs with it, constant folding uses
it, and every kernel the compiler generates must agree with it.

Kinds group ops for the passes and kernel library:
``elementwise`` (unary, one input), ``binary`` (numpy broadcasting),
``reduce``, ``conv``, ``matmul``, ``view`` (reshape: no data movement),
``layout`` (transpose, concat).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import ShapeError
from kiln.ir import dtypes

Type = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class OpSpec:
    """Shape rule and reference semantics of one primitive op."""

    name: str
    kind: str
    infer: Callable[[list[Type], dict[str, Any]], list[Type]]
    evaluate: Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]


_SPECS: dict[str, OpSpec] = {}


def get(name: str) -> OpSpec:
    """The spec of primitive ``name`` (KeyError if there is none)."""
    return _SPECS[name]


def kind(name: str) -> str:
    """The kind of primitive ``name`` (``elementwise``, ``binary``, ``reduce``, ...)."""
    return _SPECS[name].kind


def _register(name: str, kind: str, infer, evaluate) -> None:
    _SPECS[name] = OpSpec(name, kind, infer, evaluate)


# ----------------------------------------------------------------------------- elementwise
_erf = np.vectorize(math.erf, otypes=[np.float64])

#: unary primitive -> numpy function of (x, attrs); results are cast back to the input dtype
UNARY: dict[str, Callable[[np.ndarray, dict[str, Any]], np.ndarray]] = {
    "Identity": lambda x, a: x.copy(),
    "Neg": lambda x, a: -x,
    "Abs": lambda x, a: np.abs(x),
    "Relu": lambda x, a: np.maximum(x, 0),
    "Exp": lambda x, a: np.exp(x),
    "Log": lambda x, a: np.log(x),
    "Sqrt": lambda x, a: np.sqrt(x),
    "Reciprocal": lambda x, a: 1 / x,
    "Tanh": lambda x, a: np.tanh(x),
    "Sigmoid": lambda x, a: 1 / (1 + np.exp(-x)),
    "Erf": lambda x, a: _erf(x),
    "Floor": lambda x, a: np.floor(x),
    "Ceil": lambda x, a: np.ceil(x),
    "Sin": lambda x, a: np.sin(x),
    "Cos": lambda x, a: np.cos(x),
    "Clip": lambda x, a: np.clip(x, a.get("min", -np.inf), a.get("max", np.inf)),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, x * a["alpha"]),
    "HardSigmoid": lambda x, a: np.clip(x * a["alpha"] + a["beta"], 0, 1),
    "Cast": lambda x, a: x,
}

#: binary primitive -> numpy ufunc (numpy broadcasting, ONNX multidirectional broadcasting)
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Pow": np.power,
    "Max": np.maximum,
    "Min": np.minimum,
}


def _unary_infer(name):
    def infer(ts, a):
        (dt, sh), = ts
        return [(a["to"] if name == "Cast" else dt, sh)]
    return infer


def _unary_eval(name):
    fn = UNARY[name]

    def evaluate(xs, a):
        x, = xs
        out_dt = dtypes.NUMPY[a["to"]] if name == "Cast" else x.dtype
        with np.errstate(all="ignore"):
            return [np.asarray(fn(x, a)).astype(out_dt)]
    return evaluate


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcast of ``shapes`` (raises ShapeError if they do not fit)."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast") from None


def _binary_infer(ts, a):
    (da, sa), (db, sb) = ts
    if da != db:
        raise ShapeError(f"binary op operands differ in dtype: {da} vs {db}")
    return [(da, broadcast_shapes(sa, sb))]


def _binary_eval(name):
    fn = BINARY[name]

    def evaluate(xs, a):
        x, y = xs
        with np.errstate(all="ignore"):
            if name == "Div" and np.issubdtype(x.dtype, np.integer):
                return [np.trunc(x / y).astype(x.dtype)]
            return [np.asarray(fn(x, y)).astype(x.dtype)]
    return evaluate


for _n in UNARY:
    _register(_n, "elementwise", _unary_infer(_n), _unary_eval(_n))
for _n in BINARY:
    _register(_n, "binary", _binary_infer, _binary_eval(_n))


# ----------------------------------------------------------------------------- conv
def conv_out_dim(size: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> int:
    """Output extent of one spatial axis of a convolution or pool (floor mode)."""
    return (size + pad_begin + pad_end - ((k - 1) * dilation + 1)) // stride + 1


def _conv_infer(ts, a):
    (dx, sx), (_, sw) = ts[:2]
    nsp = len(sx) - 2
    if len(sw) != len(sx) or nsp < 1:
        raise ShapeError(f"Conv: input {list(sx)} and weight {list(sw)} ranks do not fit")
    g = a["group"]
    if sx[1] != sw[1] * g or sw[0] % g:
        raise ShapeError(f"Conv: input channels {sx[1]} != weight channels {sw[1]} x group {g}")
    pads = a["pads"]
    out = [conv_out_dim(sx[2 + i], sw[2 + i], a["strides"][i], a["dilations"][i], pads[i], pads[nsp + i])
           for i in range(nsp)]
    if min(out) < 1:
        raise ShapeError(f"Conv: output spatial shape {out} is empty")
    return [(dx, (sx[0], sw[0], *out))]


def _conv_eval(xs, a):
    x, w = xs[:2]
    nsp = x.ndim - 2
    g, s, d, p = a["group"], a["strides"], a["dilations"], a["pads"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p[i], p[nsp + i]) for i in range(nsp)])
    eff = [(w.shape[2 + i] - 1) * d[i] + 1 for i in range(nsp)]
    win = np.lib.stride_tricks.sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nsp)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s[i]) for i in range(nsp))
              + tuple(slice(None, None, d[i]) for i in range(nsp))]
    out_sp = _conv_infer([(x.dtype, x.shape), (w.dtype, w.shape)], a)[0][1][2:]
    win = win[(slice(None), slice(None)) + tuple(slice(0, o) for o in out_sp)]
    cin_g, cout_g = w.shape[1], w.shape[0] // g
    outs = []
    sp = "".join("hijk"[:nsp])
    ks = "".join("pqrs"[:nsp])
    for gi in range(g):
        xw = win[:, gi * cin_g:(gi + 1) * cin_g]
        wg = w[gi * cout_g:(gi + 1) * cout_g]
        outs.append(np.einsum(f"nc{sp}{ks},oc{ks}->no{sp}", xw, wg, optimize=True))
    return [np.concatenate(outs, axis=1).astype(x.dtype)]


_register("Conv", "conv", _conv_infer, _conv_eval)


# ----------------------------------------------------------------------------- matmul
def _matmul_infer(ts, a):
    (da, sa), (_, sb) = ts
    if len(sa) < 2 or len(sb) < 2:
        raise ShapeError(f"MatMul needs rank >= 2 operands (1-D is expanded by the frontend), got {list(sa)}, {list(sb)}")
    if sa[-1] != sb[-2]:
        raise ShapeError(f"MatMul: inner dims differ: {list(sa)} @ {list(sb)}")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    return [(da, (*batch, sa[-2], sb[-1]))]


_register("MatMul", "matmul", _matmul_infer, lambda xs, a: [np.matmul(xs[0], xs[1]).astype(xs[0].dtype)])


# ----------------------------------------------------------------------------- reductions
REDUCE = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min}


def _reduce_infer(ts, a):
    (dt, sh), = ts
    axes = a["axes"]
    if a["keepdims"]:
        return [(dt, tuple(1 if i in axes else d for i, d in enumerate(sh)))]
    return [(dt, tuple(d for i, d in enumerate(sh) if i not in axes))]


def _reduce_eval(name):
    fn = REDUCE[name]
    return lambda xs, a: [np.asarray(fn(xs[0], axis=tuple(a["axes"]), keepdims=bool(a["keepdims"]))).astype(xs[0].dtype)]


for _n in REDUCE:
    _register(_n, "reduce", _reduce_infer, _reduce_eval(_n))


# ----------------------------------------------------------------------------- data movement
def _reshape_infer(ts, a):
    (dt, sh), = ts
    new = tuple(a["shape"])
    if int(np.prod(new, dtype=np.int64)) != int(np.prod(sh, dtype=np.int64)):
        raise ShapeError(f"Reshape: cannot reshape {list(sh)} to {list(new)}")
    return [(dt, new)]


_register("Reshape", "view", _reshape_infer, lambda xs, a: [xs[0].reshape(a["shape"])])


def _transpose_infer(ts, a):
    (dt, sh), = ts
    return [(dt, tuple(sh[p] for p in a["perm"]))]


_register("Transpose", "layout", _transpose_infer, lambda xs, a: [np.ascontiguousarray(np.transpose(xs[0], a["perm"]))])


def _concat_infer(ts, a):
    ax = a["axis"]
    dt, sh0 = ts[0]
    for d, s in ts[1:]:
        if d != dt or len(s) != len(sh0) or any(x != y for i, (x, y) in enumerate(zip(s, sh0)) if i != ax):
            raise ShapeError(f"Concat: inputs {[list(t[1]) for t in ts]} do not fit along axis {ax}")
    return [(dt, tuple(sum(t[1][ax] for t in ts) if i == ax else d for i, d in enumerate(sh0)))]


_register("Concat", "layout", _concat_infer, lambda xs, a: [np.concatenate(xs, axis=a["axis"])])


# ----------------------------------------------------------------------------- pooling
def pool_out_dim(size: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil_mode: int) -> int:
    """Output extent of one pooled axis (ONNX MaxPool-12 / AveragePool-19 formula, floor or ceil mode).

    In ceil mode a last window that would start in the end padding is dropped.
    """
    span = size + pad_begin + pad_end - ((k - 1) * dilation + 1)
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def _pool_infer(ts, a):
    (dt, sh), = ts
    nsp = len(sh) - 2
    k, s, d, p = a["kernel_shape"], a["strides"], a["dilations"], a["pads"]
    out = [pool_out_dim(sh[2 + i], k[i], s[i], d[i], p[i], p[nsp + i], a["ceil_mode"]) for i in range(nsp)]
    if nsp < 1 or min(out) < 1:
        raise ShapeError(f"pooling window {list(k)} does not fit input {list(sh)}")
    return [(dt, (*sh[:2], *out))]


def _pool_windows(x: np.ndarray, a, fill: float):
    """Yield ``(window values, inside-input mask, inside-padding mask)`` per kernel offset, shaped like the output."""
    nsp = x.ndim - 2
    out = _pool_infer([(x.dtype, x.shape)], a)[0][1][2:]
    k, s, d, p = a["kernel_shape"], a["strides"], a["dilations"], a["pads"]
    for offs in np.ndindex(*k):
        idx = [np.arange(out[i]) * s[i] - p[i] + offs[i] * d[i] for i in range(nsp)]
        inside = np.ones(out, bool)
        padded = np.ones(out, bool)
        for i in range(nsp):
            shape = [1] * nsp
            shape[i] = -1
            inside = inside & ((idx[i] >= 0) & (idx[i] < x.shape[2 + i])).reshape(shape)
            padded = padded & (idx[i] < x.shape[2 + i] + p[nsp + i]).reshape(shape)
        grid = np.ix_(*[np.clip(i, 0, x.shape[2 + n] - 1) for n, i in enumerate(idx)])
        vals = x[(slice(None), slice(None)) + grid]
        yield np.where(inside, vals, fill), inside, padded


def _maxpool_eval(xs, a):
    x, = xs
    out = None
    for vals, _, _ in _pool_windows(x, a, -np.inf):
        out = vals if out is None else np.maximum(out, vals)
    return [out.astype(x.dtype)]


def _avgpool_eval(xs, a):
    x, = xs
    total, count = 0.0, 0
    for vals, inside, padded in _pool_windows(x, a, 0.0):
        total = total + vals
        count = count + (padded if a["count_include_pad"] else inside)
    return [(total / np.maximum(count, 1)).astype(x.dtype)]


_register("MaxPool", "pool", _pool_infer, _maxpool_eval)
_register("AveragePool", "pool", _pool_infer, _avgpool_eval)
