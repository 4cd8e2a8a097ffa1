"""Tensor expressions of elementwise primitives (unary, binary with broadcasting)."""

from __future__ import annotations

from typing import Any

from kiln.ir import dtypes
from kiln.te.compute import Tensor, compute
from kiln.te.expr import Const, Expr, binop, call, cast, const, select

#: an operand: a tensor read with broadcasting, or a scalar literal baked into the kernel
Operand = Tensor | float | int


def bcast_load(x: Operand, axes: tuple, dtype: str = "float32") -> Expr:
    """Read ``x`` at output ``axes`` with numpy broadcasting (size-1 dims read index 0)."""
    if not isinstance(x, Tensor):
        return const(x, dtype)
    off = len(axes) - len(x.shape)
    return x[tuple(0 if d == 1 else axes[off + k] for k, d in enumerate(x.shape))]


def erf(x: Expr) -> Expr:
    """erf(x) by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd-symmetric."""
    a = call("abs", x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - poly * call("exp", -(a * a))
    return select(binop("<", x, 0.0), -y, y)


def tanh(x: Expr) -> Expr:
    """tanh(x), clamped to |x| <= 15 first: some drivers' tanh overflows to NaN for large |x|."""
    return call("tanh", call("clamp", x, -15.0, 15.0))


def power(a: Expr, b: Expr) -> Expr:
    """a ** b with ONNX/numpy results for negative bases and integral exponents.

    WGSL's ``pow`` (WGSL 17.5.41) is undefined for ``a < 0``; the magnitude comes from
    ``pow(|a|, b)`` and the sign from the parity of an integral ``b``.
    """
    if isinstance(b, Const) and b.value in (1.0, 2.0, 0.5):
        return {1.0: a, 2.0: a * a, 0.5: call("sqrt", a)}[b.value]
    mag = call("pow", call("abs", a), b)
    odd = binop("==", call("abs", b - 2.0 * call("floor", b * 0.5)), 1.0)
    integral = binop("==", b, call("floor", b))
    neg = binop("<", a, 0.0)
    return select(neg, select(integral, select(odd, -mag, mag), const(float("nan"), "float32")), mag)


def unary_expr(op: str, x: Expr, attrs: dict[str, Any]) -> Expr:
    """The expression of unary primitive ``op`` applied to ``x`` (see :data:`kiln.ir.ops.UNARY`)."""
    if op == "Identity":
        return x
    if op == "Neg":
        return -x
    if op == "Relu":
        return call("max", x, 0.0)
    if op == "Reciprocal":
        return 1.0 / x
    if op == "Sigmoid":
        return 1.0 / (1.0 + call("exp", -x))
    if op == "Tanh":
        return tanh(x)
    if op == "Erf":
        return erf(x)
    if op == "Clip":
        lo, hi = attrs.get("min"), attrs.get("max")
        if lo is not None:
            x = call("max", x, lo)
        if hi is not None:
            x = call("min", x, hi)
        return x
    if op == "LeakyRelu":
        return select(binop(">=", x, 0.0), x, x * attrs["alpha"])
    if op == "HardSigmoid":
        return call("clamp", x * attrs["alpha"] + attrs["beta"], 0.0, 1.0)
    if op == "Cast":
        return cast(x, dtypes.expr_dtype(attrs["to"]))
    fn = {"Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Floor": "floor", "Ceil": "ceil",
          "Sin": "sin", "Cos": "cos"}[op]
    return call(fn, x)


def binary_expr(op: str, a: Expr, b: Expr) -> Expr:
    """The expression of binary primitive ``op`` (see :data:`kiln.ir.ops.BINARY`)."""
    if op == "Pow":
        return power(a, b)
    if op in ("Max", "Min"):
        return call(op.lower(), a, b)
    return binop({"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}[op], a, b)


def unary(op: str, x: Tensor, attrs: dict[str, Any], name: str = "out") -> Tensor:
    """Elementwise unary primitive over tensor ``x``."""
    return compute(x.shape, lambda *i: unary_expr(op, x[i], attrs), name)


def binary(op: str, a: Operand, b: Operand, shape: tuple[int, ...], name: str = "out") -> Tensor:
    """Elementwise binary primitive with broadcasting to ``shape``; scalars become literals."""
    dtype = next(t.dtype for t in (a, b) if isinstance(t, Tensor))
    return compute(shape, lambda *i: binary_expr(op, bcast_load(a, i, dtype), bcast_load(b, i, dtype)), name)
