"""Tensor expressions of elementwise primitives (unary, binary with broadcasting)."""

from __future__ import annotations

import math
from typing import Any

from kiln.arith.expr import Const, Expr, binop, call, cast, const, select
from kiln.ir import dtypes
from kiln.kernels.narrow import isnan, round_narrow
from kiln.kernels.storage import wrap
from kiln.te.compute import Tensor, compute

#: an operand: a tensor read with broadcasting, or a scalar literal baked into the kernel
Operand = Tensor | float | int


def bcast_load(x: Operand, axes: tuple, dtype: str = "float32") -> Expr:
    """Read ``x`` at output ``axes`` with numpy broadcasting (size-1 dims read index 0)."""
    if isinstance(x, Expr):  # a run-time dim read by the kernel (a scalar size expression)
        return cast(x, dtype)
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
    """tanh(x), clamped to |x| <= 15 first: some drivers' tanh overflows to NaN for large |x|.

    Below |x| < 1/16 it is the series x (1 - x^2/3 + 2x^4/15): drivers computing tanh from
    exponentials lose the relative precision of tiny results there.
    """
    x2 = x * x
    series = x * (1.0 - x2 * ((1 / 3) - x2 * (2 / 15)))
    return select(binop("<", call("abs", x), 0.0625), series, call("tanh", call("clamp", x, -15.0, 15.0)))


def power(a: Expr, b: Expr) -> Expr:
    """a ** b with ONNX/numpy results for negative bases and integral exponents.

    WGSL's ``pow`` (WGSL 17.5.41) is undefined for ``a < 0``; the magnitude comes from
    ``pow(|a|, b)`` and the sign from the parity of an integral ``b``; ``a ** 0`` is 1.
    """
    if isinstance(b, Const) and b.value in (1.0, 2.0, 0.5):
        return {1.0: a, 2.0: a * a, 0.5: call("sqrt", a)}[b.value]
    mag = call("pow", call("abs", a), b)
    odd = binop("==", call("abs", b - 2.0 * call("floor", b * 0.5)), 1.0)
    integral = binop("==", b, call("floor", b))
    neg = binop("<", a, 0.0)
    value = select(neg, select(integral, select(odd, -mag, mag), const(float("nan"), "float32")), mag)
    return select(binop("==", b, 0.0), 1.0, value)  # x ** 0 == 1, also for x = 0 (WGSL's pow(0, 0) is undefined)


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
        to = attrs["to"]
        if to in dtypes.NARROW_FLOATS:
            return round_narrow(cast(x, "float32"), to, bool(attrs.get("saturate", 0)), attrs.get("round_mode", "up"))
        if to in dtypes.NARROW_INTS:
            return wrap(cast(x, "int32"), to)
        return cast(x, dtypes.expr_dtype(to))
    if op in _SPECIAL:
        return _SPECIAL[op](x, attrs)
    fn = {"Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Floor": "floor", "Ceil": "ceil",
          "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh",
          "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Round": "round"}[op]
    return call(fn, x)


def softplus(x: Expr) -> Expr:
    """log(1 + exp(x)) without overflow or cancellation: max(x, 0) + log1p(exp(-|x|)).

    WGSL has no log1p: below 0.01 it is the series u - u^2/2 + u^3/3 (relative error < 3e-7).
    """
    u = call("exp", -call("abs", x))
    log1p = select(binop("<", u, 0.01), u * (1.0 - u * (0.5 - u * (1 / 3))), call("log", 1.0 + u))
    return call("max", x, 0.0) + log1p


def expm1_neg(x: Expr, alpha) -> Expr:
    """alpha * (exp(x) - 1), the negative branch of Elu/Selu/Celu."""
    return (call("exp", x) - 1.0) * alpha


def _gelu(x: Expr, a) -> Expr:
    if a.get("approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + erf(x * (1 / math.sqrt(2))))


def _sign(x: Expr, a) -> Expr:
    if x.dtype == "int32":
        return select(binop(">", x, 0), 1, select(binop("<", x, 0), -1, 0))
    return call("sign", x)


def _isinf(x: Expr, a) -> Expr:
    """From the bits: comparing with an infinite literal fails in Tint, which rejects infinite constants."""
    inf = binop("==", binop("&", call("bitcast_i32", x), 0x7FFFFFFF), 0x7F800000)
    pos = binop("&&", inf, binop(">", x, 0.0)) if a.get("detect_positive", 1) else const(False, "bool")
    neg = binop("&&", inf, binop("<", x, 0.0)) if a.get("detect_negative", 1) else const(False, "bool")
    return binop("||", pos, neg)


#: unary primitives whose expression is more than one builtin (see :data:`kiln.ir.ops.UNARY` for semantics)
_SPECIAL = {
    "Sign": _sign,
    "Not": lambda x, a: binop("==", x, False),
    "BitwiseNot": lambda x, a: binop("^", x, -1),
    "IsNaN": lambda x, a: isnan(x),
    # some drivers' asin/acos are only good to ~3e-4 (lavapipe); atan is accurate
    "Asin": lambda x, a: call("atan", x / call("sqrt", (1.0 - x) * (1.0 + x))),
    "Acos": lambda x, a: 2.0 * call("atan", call("sqrt", (1.0 - x) / (1.0 + x))),
    "IsInf": _isinf,
    "BitcastInt32": lambda x, a: call("bitcast_i32", x),
    "BitcastFloat32": lambda x, a: call("bitcast_f32", x),
    "Softplus": lambda x, a: softplus(x),
    "Softsign": lambda x, a: x / (1.0 + call("abs", x)),
    "Elu": lambda x, a: select(binop("<", x, 0.0), expm1_neg(x, a["alpha"]), x),
    "Selu": lambda x, a: select(binop("<=", x, 0.0), expm1_neg(x, a["alpha"]), x) * a["gamma"],
    "Celu": lambda x, a: call("max", x, 0.0) + call("min", 0.0, expm1_neg(x / a["alpha"], a["alpha"])),
    "ThresholdedRelu": lambda x, a: select(binop(">", x, a["alpha"]), x, 0.0),
    "Shrink": lambda x, a: select(binop("<", x, -a["lambd"]), x + a["bias"],
                                  select(binop(">", x, a["lambd"]), x - a["bias"], 0.0)),
    "Mish": lambda x, a: x * tanh(softplus(x)),
    "Gelu": _gelu,
}


def modulo(a: Expr, b: Expr) -> Expr:
    """ONNX Mod with fmod=0 (integers, and floats when the frontend does not decompose it): the remainder takes
    the divisor's sign (Python's ``%``)."""
    r = binop("%", a, b)
    fix = binop("&&", binop("!=", r, 0), binop("!=", binop("<", r, 0), binop("<", b, 0)))
    out = select(fix, r + b, r)
    if a.dtype != "float32":
        return out
    # WGSL's x % y is x - y * trunc(x / y): NaN for an infinite y. Python's (numpy's) x mod +-inf is x when x
    # is 0 or has y's sign, else y
    inf_b = binop("==", binop("&", call("bitcast_i32", b), 0x7FFFFFFF), 0x7F800000)
    keep = binop("||", binop("==", a, 0.0), binop("==", binop("<", a, 0.0), binop("<", b, 0.0)))
    finite_a = binop("!=", binop("&", call("bitcast_i32", a), 0x7F800000), 0x7F800000)
    return select(binop("&&", inf_b, finite_a), select(keep, a, b), out)


def binary_expr(op: str, a: Expr, b: Expr) -> Expr:
    """The expression of binary primitive ``op`` (see :data:`kiln.ir.ops.BINARY`)."""
    if op == "Pow":
        if a.dtype == "int32":
            return cast(call("round", power(cast(a, "float32"), cast(b, "float32"))), "int32")
        return power(a, b)
    if op in ("Max", "Min"):
        return call(op.lower(), a, b)
    if op == "Mod":
        return modulo(a, b)
    if op == "PRelu":
        return select(binop("<", a, 0.0), a * b, a)
    if op == "Xor":
        return binop("!=", a, b)
    if op in ("BitShiftLeft", "BitShiftRight"):  # out-of-range amounts shift everything out (ONNX BitShift)
        ok = binop("&&", binop(">=", b, 0), binop("<", b, 32))
        zero = const(0, "int32")
        out = select(binop("<", a, 0), const(-1, "int32"), zero) if op == "BitShiftRight" else zero
        return select(ok, binop(_BINOPS[op], a, b), out)
    return binop(_BINOPS[op], a, b)


_BINOPS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "FMod": "%", "BitwiseAnd": "&", "BitwiseOr": "|",
           "BitwiseXor": "^", "BitShiftLeft": "<<", "BitShiftRight": ">>", "Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=",
           "GreaterOrEqual": ">=", "And": "&&", "Or": "||"}


def unary(op: str, x: Tensor, attrs: dict[str, Any], name: str = "out") -> Tensor:
    """Elementwise unary primitive over tensor ``x``."""
    return compute(x.shape, lambda *i: unary_expr(op, x[i], attrs), name)


def binary(op: str, a: Operand, b: Operand, shape: tuple[int, ...], name: str = "out") -> Tensor:
    """Elementwise binary primitive with broadcasting to ``shape``; scalars become literals."""
    dtype = next(t.dtype for t in (a, b) if isinstance(t, (Tensor, Expr)))
    return compute(shape, lambda *i: binary_expr(op, bcast_load(a, i, dtype), bcast_load(b, i, dtype)), name)


def where(cond: Operand, x: Operand, y: Operand, shape: tuple[int, ...], name: str = "where") -> Tensor:
    """ONNX Where-9/16: ``x`` where ``cond`` else ``y``, all three broadcast to ``shape``; scalars become literals."""
    dtype = next((t.dtype for t in (x, y) if isinstance(t, Tensor)), None)
    if dtype is None:
        dtype = "bool" if isinstance(x, bool) else "int32" if isinstance(x, int) else "float32"
    return compute(shape, lambda *i: select(bcast_load(cond, i, "bool"), bcast_load(x, i, dtype),
                                            bcast_load(y, i, dtype)), name)
