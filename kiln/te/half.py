"""fp16 compute: a kernel's tensor expression rewritten to compute in half precision where that is safe.

Kernels are defined once, in f32 (:mod:`kiln.kernels`). With ``kiln compile --precision fp16`` float
activations and weights are stored as f16 (the loads of the expression read ``float16`` placeholders
and are widened to f32, its result is narrowed to f16 for the store), and :func:`demote` then moves
the arithmetic itself to f16 (WGSL ``f16``, the "f16" extension; WebGPU feature ``shader-f16``)
under these mixed-precision rules:

- **f16**: ``+``, ``-``, ``*``, comparisons, ``abs``, ``max``, ``min``, ``clamp``, ``floor``,
  ``ceil``, ``round``, ``sign``, ``trunc`` and ``select`` when every operand is f16 (a value loaded
  from an f16 buffer, or the result of another f16 operation) or a constant that is finite and
  within f16's normal range (it is rounded to f16). Residual adds, bias adds, ReLU/Clip, max pooling
  and the other elementwise kernels of a convolutional network compute in f16.
- **f32** (numerically fragile in f16, or cheap enough to keep exact): division (``1/x`` and
  ``x/y`` overflow or lose range in f16), ``exp``, ``log``, ``pow``, ``sqrt``, trigonometric and
  hyperbolic functions (so Sigmoid, Softmax, Erf/Gelu, Tanh, Softplus, the LayerNormalization
  reciprocal square root), and every operation with an f32 operand: a value computed in f32 stays
  in f32 until it is stored (it is rounded to f16 once, at the store, not after each fragile op).
- **reductions** accumulate in f32: sums and products (Conv, ConvTranspose, MatMul/Gemm, the
  statistics of LayerNormalization, Softmax and ReduceMean), whose bodies are also computed in f32
  from the f16 loads (an f16 x f16 product is exact in f32), and max/min (exact either way).
  ``accumulate="float16"`` (``--precision fp16-acc16``) instead computes *dot products* (a sum of
  products of two loaded tensors: Conv, MatMul, Gemm) in f16 with an f16 accumulator, as fp16 GEMMs
  without f32 accumulation do; statistics stay in f32 even then.
- Index arithmetic (Gather/Resize/GridSample coordinates, any float that becomes an index) is
  computed in f32; integer and bool values are untouched.

The rewrite is exact where it keeps f32 and rounds where it moves to f16; results match an f32
computation to f16's precision (about 3 decimal digits, a relative error of 2^-11 per rounding).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.arith.expr import Bin, Call, Cast, Const, Expr, Load, Reduce, Select, binop, call, cast, const, select
from kiln.te.compute import Tensor

#: binary ops computed in f16 when their operands are f16 ("/" stays f32: range)
HALF_BINOPS = {"+", "-", "*", "<", "<=", ">", ">=", "==", "!="}

_CMP = {"<", "<=", ">", ">=", "==", "!="}

#: expression functions computed in f16 when their arguments are f16 (exact or range-safe in f16)
HALF_CALLS = {"abs", "max", "min", "clamp", "floor", "ceil", "round", "sign", "trunc"}

#: the largest finite f16 value and the smallest normal one
F16_MAX = 65504.0
F16_MIN_NORMAL = 2.0**-14

#: what ``accumulate`` may be
ACCUMULATE = ("float32", "float16")


def _fits(c: Const) -> bool:
    """Whether float constant ``c`` may be rounded to f16 (finite, within range, zero or normal)."""
    v = float(c.value)
    return math.isfinite(v) and (v == 0.0 or F16_MIN_NORMAL <= abs(v) <= F16_MAX)


def _leaf(e: Expr) -> bool:
    """A loaded tensor element: a load, widened or not, possibly under a select with a constant
    (a padded convolution's input)."""
    if isinstance(e, Cast):
        return _leaf(e.x)
    if isinstance(e, Select):
        return (_leaf(e.t) and isinstance(e.f, Const)) or (_leaf(e.f) and isinstance(e.t, Const))
    return isinstance(e, Load)


def is_dot(body: Expr) -> bool:
    """Whether a sum's ``body`` is a product of two loaded tensors (Conv, MatMul, Gemm), not a statistic."""
    return isinstance(body, Bin) and body.op == "*" and _leaf(body.a) and _leaf(body.b)


class _Demoter:
    def __init__(self, accumulate: str):
        if accumulate not in ACCUMULATE:
            raise ValueError(f"accumulate must be one of {ACCUMULATE}, not {accumulate!r}")
        self.accumulate = accumulate
        self.memo: dict[tuple[int, bool], Expr] = {}

    @staticmethod
    def to32(x: Expr) -> Expr:
        return cast(x, "float32") if x.dtype == "float16" else x

    @staticmethod
    def to16(x: Expr) -> Expr:
        return const(float(np.float16(x.value)), "float16") if isinstance(x, Const) else x

    @staticmethod
    def halves(xs: list[Expr], exact: bool = False) -> bool:
        """Every float operand is f16 or an f16-able constant (with ``exact``, one f16 represents
        exactly: comparisons keep their thresholds), and one at least is f16."""
        floats = [x for x in xs if x.dtype in ("float32", "float16")]
        return (any(x.dtype == "float16" for x in floats)
                and all(x.dtype == "float16" or (isinstance(x, Const) and _fits(x)
                                                 and (not exact or float(np.float16(x.value)) == x.value))
                        for x in floats))

    def go(self, e: Expr, half: bool) -> Expr:
        """``e`` rewritten; with ``half`` False everything is computed in f32 (loads are still f16)."""
        key = (id(e), half)
        if key not in self.memo:
            self.memo[key] = self._go(e, half)
        return self.memo[key]

    def _go(self, e: Expr, half: bool) -> Expr:
        if isinstance(e, Cast):
            x = self.go(e.x, half)
            if e.dtype == "float32" and x.dtype == "float16":
                return x  # the widening of an f16 load: the value is the same, keep it in f16
            if e.dtype == "float16" and x.dtype == "float32":
                return cast(narrowable(x), "float16")
            return cast(x, e.dtype)
        if isinstance(e, Load):
            return Load(e.tensor, tuple(self.go(i, False) for i in e.indices), e.dtype)
        if isinstance(e, Bin):
            a, b = self.go(e.a, half), self.go(e.b, half)
            if a.dtype not in ("float32", "float16") and b.dtype not in ("float32", "float16"):
                return binop(e.op, a, b)
            if half and e.op in HALF_BINOPS and self.halves([a, b], exact=e.op in _CMP):
                return binop(e.op, self.to16(a), self.to16(b))
            return binop(e.op, self.to32(a), self.to32(b))
        if isinstance(e, Call):
            args = [self.go(a, half) for a in e.args]
            if half and e.fn in HALF_CALLS and self.halves(args):
                return call(e.fn, *(self.to16(a) for a in args))
            return call(e.fn, *(self.to32(a) for a in args))
        if isinstance(e, Select):
            c, t, f = self.go(e.cond, half), self.go(e.t, half), self.go(e.f, half)
            if t.dtype not in ("float32", "float16"):
                return select(c, t, f)
            if half and self.halves([t, f]):
                return select(c, self.to16(t), self.to16(f))
            return select(c, self.to32(t), self.to32(f))
        if isinstance(e, Reduce):
            if e.dtype != "float32":
                return Reduce(e.op, self.go(e.body, False), e.axes, e.dtype)
            if half and self.accumulate == "float16" and e.op == "sum" and is_dot(e.body):
                body = self.go(e.body, True)
                if body.dtype == "float16":
                    return Reduce(e.op, body, e.axes, "float16")
            body = self.to32(self.go(e.body, False))
            return Reduce(e.op, body, e.axes, "float32")
        return e  # Var, Const


def narrowable(x: Expr) -> Expr:
    """f32 ``x`` ready for a conversion to f16: values beyond f16's range made infinite (WGSL leaves
    the conversion of out-of-range values indeterminate, §15.7.6), so an overflow is +-inf, never garbage.
    Infinities are made at run time (Chromium's Tint rejects infinite constants)."""
    return x * select(binop(">=", call("abs", x), 65520.0), 1e38, 1.0)  # no select of x: its loads stay unguarded


def demote(t: Tensor, accumulate: str = "float32") -> Tensor:
    """``t`` (an inlined kernel expression over f16-stored placeholders, see the module docstring)
    with its arithmetic moved to f16 where the mixed-precision rules allow.

    Args:
        t: a computed tensor whose placeholders of f16 buffers have dtype ``float16`` (read through a
            cast to f32) and whose body, if it is stored as f16, is cast to ``float16``.
        accumulate: ``float32`` (default) or ``float16``: the accumulator of dot-product sums.

    Returns:
        The same tensor (shape, axes, attrs) with a rewritten body; its dtype is the body's.

    Raises:
        ValueError: an unknown ``accumulate``.
    """
    body = _Demoter(accumulate).go(t.body, True)
    if t.dtype == "float16" and body.dtype == "float32":
        body = cast(narrowable(body), "float16")
    elif t.dtype == "float32" and body.dtype == "float16":
        body = cast(body, "float32")
    return Tensor(t.name, t.shape, body.dtype, t.axes, body, t.attrs)
