"""Primitive ops of the graph IR: their shape rules and numpy semantics.

This module is the executable specification of every primitive: ``infer`` gives
output dtypes and shapes, ``evaluate`` computes outputs with numpy. The
interpreter (:mod:`kiln.ir.interp`) runs graphs with it, constant folding uses
it, and every kernel the compiler generates must agree with it.

Kinds group ops for the passes and kernel library:
``elementwise`` (unary, one input), ``binary`` (numpy broadcasting), ``ternary`` (Where),
``reduce``, ``conv``, ``matmul``, ``view`` (reshape: no data movement),
``layout`` (transpose, concat).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ShapeError
from kiln.ir import dtypes
from kiln.ir.registry import OpSpec, Type, broadcast_shapes, get, is_symbolic, kind, register  # noqa: F401  (re-exported)

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
    "Cast": lambda x, a: _saturate(x, a),
    "Sign": lambda x, a: np.sign(x),
    "Round": lambda x, a: np.round(x),
    "Not": lambda x, a: np.logical_not(x),
    "BitwiseNot": lambda x, a: np.invert(x),
    "IsNaN": lambda x, a: np.isnan(x),
    "IsInf": lambda x, a: (np.isposinf(x) & bool(a.get("detect_positive", 1)))
    | (np.isneginf(x) & bool(a.get("detect_negative", 1))),
    "Tan": lambda x, a: np.tan(x),
    "Asin": lambda x, a: np.arcsin(x),
    "Acos": lambda x, a: np.arccos(x),
    "Atan": lambda x, a: np.arctan(x),
    "Sinh": lambda x, a: np.sinh(x),
    "Cosh": lambda x, a: np.cosh(x),
    "Asinh": lambda x, a: np.arcsinh(x),
    "Acosh": lambda x, a: np.arccosh(x),
    "Atanh": lambda x, a: np.arctanh(x),
    "Softplus": lambda x, a: np.logaddexp(x, 0),
    "Softsign": lambda x, a: x / (1 + np.abs(x)),
    "Elu": lambda x, a: np.where(x < 0, a["alpha"] * (np.exp(x) - 1), x),
    "Selu": lambda x, a: a["gamma"] * np.where(x <= 0, a["alpha"] * (np.exp(x) - 1), x),
    "Celu": lambda x, a: np.maximum(x, 0) + np.minimum(0, a["alpha"] * (np.exp(x / a["alpha"]) - 1)),
    "ThresholdedRelu": lambda x, a: np.where(x > a["alpha"], x, 0),
    "Shrink": lambda x, a: np.where(x < -a["lambd"], x + a["bias"], np.where(x > a["lambd"], x - a["bias"], 0)),
    "Mish": lambda x, a: x * np.tanh(np.logaddexp(x, 0)),
    "BitcastInt32": lambda x, a: x.view(np.int32),
    "BitcastFloat32": lambda x, a: x.view(np.float32),
    "Gelu": lambda x, a: 0.5 * x * (1 + (_erf(x / math.sqrt(2)) if a.get("approximate", "none") == "none" else
                                         np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
}

def _saturate(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    """Cast's input, clipped to a float8 target's finite range when ``saturate`` (NaN kept; ONNX Cast-19);
    for float8e8m0, the rounded value itself (``round_mode`` up, down or nearest; ONNX Cast-24)."""
    if a["to"] == "float8e8m0":
        from onnx.numpy_helper import to_float8e8m0

        return to_float8e8m0(x.astype(np.float32), bool(a.get("saturate", 1)), a.get("round_mode", "up"))
    if not a.get("saturate") or not str(a["to"]).startswith("float8"):
        return x
    import ml_dtypes

    top = float(ml_dtypes.finfo(dtypes.NUMPY[a["to"]]).max)
    xf = x.astype(np.float32)
    return np.where(np.isnan(xf), xf, np.clip(xf, -top, top))


#: unary primitives whose result has a fixed dtype, whatever the input's
UNARY_DTYPE = {"IsNaN": "bool", "IsInf": "bool", "BitcastInt32": "int32", "BitcastFloat32": "float32"}

def _shift(x: np.ndarray, s: np.ndarray, fn, negative_fill: int) -> np.ndarray:
    """ONNX BitShift: a shift by a negative amount or by the type's width or more gives 0 (or -1 for
    a negative value shifted right)."""
    width = x.dtype.itemsize * 8
    ok = (s >= 0) & (s < width)
    fill = np.where(x < 0, negative_fill, 0) if negative_fill else 0
    return np.where(ok, fn(x, np.where(ok, s, 0)), fill)


#: binary primitive -> numpy ufunc (numpy broadcasting, ONNX multidirectional broadcasting)
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Pow": np.power,
    "Max": np.maximum,
    "Min": np.minimum,
    "Mod": np.mod,
    "FMod": np.fmod,
    "PRelu": lambda x, slope: np.where(x < 0, x * slope, x),
    "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or,
    "BitwiseXor": np.bitwise_xor,
    "BitShiftLeft": lambda x, s: _shift(x, s, np.left_shift, 0),
    "BitShiftRight": lambda x, s: _shift(x, s, np.right_shift, -1),
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}

#: binary primitives whose result is bool (comparisons and logic)
BINARY_BOOL = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"}


def _unary_infer(name):
    def infer(ts, a):
        (dt, sh), = ts
        return [(a["to"] if name == "Cast" else UNARY_DTYPE.get(name, dt), sh)]
    return infer


def _unary_eval(name):
    fn = UNARY[name]

    def evaluate(xs, a):
        x, = xs
        out_dt = dtypes.NUMPY[a["to"] if name == "Cast" else UNARY_DTYPE.get(name, dtypes.from_numpy(x.dtype))]
        with np.errstate(all="ignore"):
            return [np.asarray(fn(x, a)).astype(out_dt)]
    return evaluate


def _binary_infer(name):
    def infer(ts, a):
        (da, sa), (db, sb) = ts
        if da != db:
            raise ShapeError(f"{name}: operands differ in dtype: {da} vs {db}")
        return [("bool" if name in BINARY_BOOL else da, broadcast_shapes(sa, sb))]
    return infer


def _binary_eval(name):
    fn = BINARY[name]

    def evaluate(xs, a):
        x, y = xs
        out_dt = np.bool_ if name in BINARY_BOOL else x.dtype
        with np.errstate(all="ignore"):
            if name == "Div" and np.issubdtype(x.dtype, np.integer):
                return [np.trunc(x / np.where(y == 0, 1, y)).astype(x.dtype)]
            if name in ("Mod", "FMod") and np.issubdtype(x.dtype, np.integer):
                y = np.where(y == 0, 1, y)
            return [np.asarray(fn(x, y)).astype(out_dt)]
    return evaluate


def _where_infer(ts, a):
    (dc, sc), (dx, sx), (dy, sy) = ts
    if dc != "bool" or dx != dy:
        raise ShapeError(f"Where: condition must be bool and branches of one dtype, got {dc}, {dx}, {dy}")
    return [(dx, broadcast_shapes(sc, sx, sy))]


for _n in UNARY:
    register(_n, "elementwise", _unary_infer(_n), _unary_eval(_n))
for _n in BINARY:
    register(_n, "binary", _binary_infer(_n), _binary_eval(_n))
register("Where", "ternary", _where_infer, lambda xs, a: [np.where(*xs)])


# ----------------------------------------------------------------------------- conv
def conv_out_dim(size: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> int:
    """Output extent of one spatial axis of a convolution or pool (floor mode)."""
    return (size + pad_begin + pad_end - ((k - 1) * dilation + 1)) // stride + 1


def _conv_infer(ts, a):
    (dx, sx), (dw, sw) = ts[:2]
    if dw != dx or any(d != dx for d, _ in ts[2:]):
        raise ShapeError(f"Conv: input, weight and bias differ in dtype: {', '.join(d for d, _ in ts)}")
    nsp = len(sx) - 2
    if len(sw) != len(sx) or nsp < 1:
        raise ShapeError(f"Conv: input {list(sx)} and weight {list(sw)} ranks do not fit")
    g = a["group"]
    if sx[1] != sw[1] * g or sw[0] % g:
        raise ShapeError(f"Conv: input channels {sx[1]} != weight channels {sw[1]} x group {g}")
    pads = a["pads"]
    out = [conv_out_dim(sx[2 + i], sw[2 + i], a["strides"][i], a["dilations"][i], pads[i], pads[nsp + i])
           for i in range(nsp)]
    if is_symbolic(out):  # a run-time spatial size: every value in bounds must give a non-empty output
        out = list(symbolic.shape(out))
        if min(symbolic.bounds(d)[0] for d in out) < 1:
            raise ShapeError(f"Conv: output spatial shape {symbolic.format_shape(out)} is empty for some run-time "
                             "dims in bounds (raise the lower bounds)")
        return [(dx, (sx[0], sw[0], *out))]
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


register("Conv", "conv", _conv_infer, _conv_eval)


# ----------------------------------------------------------------------------- matmul
def _matmul_infer(ts, a):
    (da, sa), (db, sb) = ts
    if da != db:
        raise ShapeError(f"MatMul: operands differ in dtype: {da} vs {db}")
    if len(sa) < 2 or len(sb) < 2:
        raise ShapeError(f"MatMul needs rank >= 2 operands (1-D is expanded by the frontend), got {list(sa)}, {list(sb)}")
    if sa[-1] != sb[-2]:
        raise ShapeError(f"MatMul: inner dims differ: {list(sa)} @ {list(sb)}")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    return [(da, (*batch, sa[-2], sb[-1]))]


register("MatMul", "matmul", _matmul_infer, lambda xs, a: [np.matmul(xs[0], xs[1]).astype(xs[0].dtype)])


# ----------------------------------------------------------------------------- reductions
REDUCE = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min, "ReduceProd": np.prod}


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
    register(_n, "reduce", _reduce_infer, _reduce_eval(_n))


# ----------------------------------------------------------------------------- data movement
def _reshape_infer(ts, a):
    (dt, sh), = ts
    new = tuple(a["shape"])
    if is_symbolic(new, sh):
        new = symbolic.shape(new)
        if symbolic.prod(new) != symbolic.prod(sh):
            raise ShapeError(f"Reshape: cannot reshape {symbolic.format_shape(sh)} to {symbolic.format_shape(new)}")
        return [(dt, new)]
    if int(np.prod(new, dtype=np.int64)) != int(np.prod(sh, dtype=np.int64)):
        raise ShapeError(f"Reshape: cannot reshape {list(sh)} to {list(new)}")
    return [(dt, new)]


register("Reshape", "view", _reshape_infer, lambda xs, a: [xs[0].reshape(a["shape"])])


def _transpose_infer(ts, a):
    (dt, sh), = ts
    return [(dt, tuple(sh[p] for p in a["perm"]))]


register("Transpose", "layout", _transpose_infer, lambda xs, a: [np.array(np.transpose(xs[0], a["perm"]), order="C")])


def _concat_infer(ts, a):
    ax = a["axis"]
    dt, sh0 = ts[0]
    for d, s in ts[1:]:
        if d != dt or len(s) != len(sh0) or any(x != y for i, (x, y) in enumerate(zip(s, sh0)) if i != ax):
            raise ShapeError(f"Concat: inputs {[list(t[1]) for t in ts]} do not fit along axis {ax}")
    out = tuple(sum(t[1][ax] for t in ts) if i == ax else d for i, d in enumerate(sh0))
    if is_symbolic(out):
        out = symbolic.shape(out)
    return [(dt, out)]


register("Concat", "layout", _concat_infer, lambda xs, a: [np.concatenate(xs, axis=a["axis"])])


# ----------------------------------------------------------------------------- pooling
def pool_out_dim(size: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil_mode: int) -> int:
    """Output extent of one pooled axis (ONNX MaxPool-12 / AveragePool-19 formula, floor or ceil mode).

    In ceil mode a last window that would start in the end padding is dropped. Over a run-time dim (a size
    expression ``size``) that is ``min(ceil(span / stride) + 1, (size + pad_begin - 1) // stride + 1)``: the same
    whenever at most one window is dropped, which holds when ``pad_end`` is less than the dilated kernel.

    Raises:
        ShapeError: ceil mode over a run-time dim with ``pad_end`` at least the dilated kernel.
    """
    span = size + pad_begin + pad_end - ((k - 1) * dilation + 1)
    if not isinstance(size, (int, np.integer)):
        if not ceil_mode:
            return symbolic.simplify(span // stride + 1)
        if pad_end >= (k - 1) * dilation + 1:
            raise ShapeError(f"pooling with ceil_mode=1 and end padding {pad_end} >= the window {(k - 1) * dilation + 1} "
                             "over a run-time dim is not supported; bind it with --dim")
        windows = symbolic.simplify(symbolic.ceil_div(span, stride) + 1)
        last = symbolic.simplify((size + pad_begin - 1) // stride + 1)  # windows starting before the end padding
        return symbolic.simplify(call("min", const(0, "int32") + windows, const(0, "int32") + last))
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def _pool_infer(ts, a):
    (dt, sh), = ts
    nsp = len(sh) - 2
    k, s, d, p = a["kernel_shape"], a["strides"], a["dilations"], a["pads"]
    out = [pool_out_dim(sh[2 + i], k[i], s[i], d[i], p[i], p[nsp + i], a["ceil_mode"]) for i in range(nsp)]
    if is_symbolic(out):
        if nsp < 1 or min(symbolic.bounds(d)[0] for d in out) < 1:
            raise ShapeError(f"pooling window {list(k)} does not fit input {symbolic.format_shape(sh)} for every "
                             "run-time dim in bounds")
        return [(dt, (*sh[:2], *out))]
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


register("MaxPool", "pool", _pool_infer, _maxpool_eval)
register("AveragePool", "pool", _pool_infer, _avgpool_eval)


from kiln.arith.expr import call, const
from kiln.ir import (
    ops_control,  # noqa: F401  (registers If and Loop with run-time conditions)
    ops_data,  # noqa: F401  (registers the indexing and data-movement primitives)
    ops_dynamic,  # noqa: F401  (registers SymConst and Iota, the kernels of run-time shape values)
    ops_grad,  # noqa: F401  (registers the gradient primitives of reverse-mode autodiff)
    ops_quant,  # noqa: F401  (registers MatMulNBits and GatherBlockQuantized over packed weights)
    ops_resample,  # noqa: F401  (registers Resize and ConvTranspose)
)
