"""Tensor expressions: the index-expression language every kernel is written in.

A kernel is defined once as a :class:`Tensor` whose ``body`` is an :class:`Expr`
over its output axes (:func:`kiln.te.compute.compute`), with reductions written as
:class:`Reduce` over reduction axes. Expressions are immutable and compare
structurally, so equal sub-expressions (for example a reduction inlined twice)
are recognised. Builders fold constants and trivial identities as they go
(``x * 1 -> x``, ``i + 0 -> i``), which keeps generated index arithmetic short.

Dtypes: ``float32``, ``int32`` (index arithmetic and integer tensors) and ``bool``; ``float16`` appears
only after :func:`kiln.te.half.demote` (fp16 compute, ``kiln compile --precision fp16``).
Integer ``//`` and ``%`` truncate toward zero (as WGSL's ``/`` and ``%``); ``&``, ``|``, ``^``,
``<<`` and ``>>`` (arithmetic) are bitwise on int32.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_ids = itertools.count()

#: math functions an expression may call; each target renders them (WGSL builtins, C, GLSL)
CALLS = {"exp", "log", "sqrt", "abs", "floor", "ceil", "sin", "cos", "tanh", "max", "min", "pow", "clamp",
         "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "round", "sign", "trunc",
         "bitcast_i32", "bitcast_f32", "round_f16", "half_lo", "subgroup_shuffle_xor"}

#: unary functions folded on constants (expression function -> numpy function)
_FOLD = {"exp": "exp", "log": "log", "sqrt": "sqrt", "abs": "abs", "floor": "floor", "ceil": "ceil", "sin": "sin",
         "cos": "cos", "tanh": "tanh", "tan": "tan", "round": "rint", "sign": "sign", "trunc": "trunc"}

#: floating-point expression dtypes
FLOATS = ("float32", "float16")

#: functions whose result dtype is fixed (the others return their operands' dtype)
CALL_DTYPES = {"bitcast_i32": "int32", "bitcast_f32": "float32", "half_lo": "float32"}
#: ``subgroup_shuffle_xor(x, mask)``: ``x`` of the subgroup's lane ``own lane ^ mask`` (WGSL's
#: ``subgroupShuffleXor``; only in the subgroup forms of :class:`kiln.te.loops.Subgroups`, which WGSL alone renders)
#: ``half_lo(x)``: the float32 value of int32 ``x``'s low 16 bits read as an IEEE half float (packed weights' scales)


class Expr:
    """Base of all expressions; arithmetic operators build :class:`Bin` nodes."""

    dtype: str

    def __add__(self, o): return binop("+", self, o)
    def __radd__(self, o): return binop("+", o, self)
    def __sub__(self, o): return binop("-", self, o)
    def __rsub__(self, o): return binop("-", o, self)
    def __mul__(self, o): return binop("*", self, o)
    def __rmul__(self, o): return binop("*", o, self)
    def __truediv__(self, o): return binop("/", self, o)
    def __rtruediv__(self, o): return binop("/", o, self)
    def __floordiv__(self, o): return binop("//", self, o)
    def __mod__(self, o): return binop("%", self, o)
    def __neg__(self): return binop("-", const(0, self.dtype), self)
    def __and__(self, o): return binop("&&", self, o)

    def _hash(self) -> int:
        """Structural hash, computed once per node (expressions are immutable and often deep)."""
        try:
            return self.__dict__["_hash_value"]
        except KeyError:
            h = hash((type(self).__name__, *(self.__dict__[f] for f in self.__dataclass_fields__)))
            object.__setattr__(self, "_hash_value", h)
            return h

    def _repr(self) -> str:
        """``repr``, computed once per node (lowering sorts terms by it)."""
        try:
            return self.__dict__["_repr_value"]
        except KeyError:
            fields = ", ".join(f"{f}={self.__dict__[f]!r}" for f in self.__dataclass_fields__)
            r = f"{type(self).__name__}({fields})"
            object.__setattr__(self, "_repr_value", r)
            return r


@dataclass(frozen=True, eq=True)
class Var(Expr):
    """An integer loop or axis variable; ``extent`` is set for reduction axes."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    name: str
    extent: int | Expr = 0
    dtype: str = "int32"


@dataclass(frozen=True, eq=True)
class SizeVar(Expr):
    """A run-time size symbol (a dynamic dim such as ``seq``), bound per run by the runtime.

    Kernels read it from the dims uniform (word ``index``, see :mod:`kiln.codegen.webgpu.wgsl`); the
    compiler knows only its bounds ``lo <= value <= hi``, ``opt``, the value schedules are chosen
    for, and ``multiple``, a number the value is a multiple of (docs/dynamic-shapes.md). Python
    comparisons (``<``, ``>``) and ``int()`` of a size expression raise TypeError: code must never
    pick a branch on a value it does not know.
    """

    __hash__ = Expr._hash

    def __repr__(self) -> str:
        return f"SizeVar({self.name})"

    name: str
    index: int
    lo: int
    hi: int
    opt: int
    dtype: str = "int32"
    #: the value is a multiple of this (``--dim H=32..960%32``; 1: any value)
    multiple: int = 1
    #: a dim the user gave no upper bound (``--dim batch=1..``, or a symbolic dim left unbound): buffers sized by
    #: it grow at run time (docs/dynamic-shapes.md, *Growable buffers*); ``hi`` is :data:`GROW_HI` or a bound the
    #: import inferred from the model
    grow: bool = False


@dataclass(frozen=True, eq=True)
class Const(Expr):
    """A literal (``value`` is a Python float, int or bool)."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    value: float | int | bool
    dtype: str


@dataclass(frozen=True, eq=True)
class Bin(Expr):
    """A binary arithmetic, comparison or logical operation."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    op: str
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Call(Expr):
    """A math function from :data:`CALLS` applied to ``args``."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    fn: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, eq=True)
class Select(Expr):
    """``t if cond else f``. Loads inside ``t`` may be out of bounds when ``cond`` is false; lowering guards them."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    cond: Expr
    t: Expr
    f: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    """Numeric conversion of ``x`` to ``dtype``."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    x: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Load(Expr):
    """Element ``indices`` of ``tensor`` (one index per dim)."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    tensor: Tensor  # noqa: F821  (kiln.te.compute.Tensor; hashed by identity)
    indices: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, eq=True)
class Reduce(Expr):
    """``op`` (``sum``, ``prod``, ``max``, ``min``) of ``body`` over the reduction ``axes``."""

    __hash__ = Expr._hash
    __repr__ = Expr._repr

    op: str
    body: Expr
    axes: tuple[Var, ...]
    dtype: str


ExprLike = Expr | int | float | bool

_CMP = {"<", "<=", ">", ">=", "==", "!="}
_PY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
       "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
       "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "&&": lambda a, b: a and b, "||": lambda a, b: a or b,
       "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
       "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
       "max": max, "min": min}


def const(value: float | bool, dtype: str) -> Const:
    """A literal of ``dtype``; an int32 value outside int32's range wraps around (two's complement), as int32
    arithmetic does: folding ``(x + a) * b + c`` into ``x * b + (a * b + c)`` keeps every result."""
    if dtype == "bool":
        return Const(bool(value), dtype)
    if dtype == "int32":
        return Const((int(value) + 2**31) % 2**32 - 2**31, dtype)
    return Const(float(value), dtype)


def as_expr(x: ExprLike, like: str = "float32") -> Expr:
    """Wrap a Python number as a :class:`Const` (int -> int32 unless ``like`` is a float type)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return const(x, "bool")
    if isinstance(x, int) and like not in FLOATS:
        return const(x, "int32")
    return const(x, like if like != "bool" else "float32")


def binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """Build ``a op b`` with constant folding and algebraic identities."""
    if not isinstance(a, Expr):
        a = as_expr(a, b.dtype if isinstance(b, Expr) else "float32")
    if not isinstance(b, Expr):
        b = as_expr(b, a.dtype)
    if a.dtype != b.dtype:
        raise TypeError(f"expression operands differ in dtype: {a.dtype} {op} {b.dtype}")
    dtype = "bool" if op in _CMP else a.dtype
    ca = a.value if isinstance(a, Const) else None
    cb = b.value if isinstance(b, Const) else None
    if ca is not None and cb is not None:
        if op in _PY:
            return const(_PY[op](ca, cb), dtype)
        if op == "//" and cb:
            return const(ca // cb, dtype)
        if op == "%" and cb:
            return const(ca % cb, dtype)
        if op == "/" and a.dtype == "float32" and cb:
            return const(ca / cb, dtype)
    is_int = a.dtype == "int32"
    if op == "+":
        if cb == 0:
            return a
        if ca == 0:
            return b
    elif op == "-":
        if cb == 0:
            return a
    elif op == "*":
        if cb == 1:
            return a
        if ca == 1:
            return b
        if is_int and (ca == 0 or cb == 0):
            return const(0, dtype)
    elif op in ("/", "//"):
        if cb == 1:
            return a
    elif op == "%":
        if is_int and cb == 1:
            return const(0, dtype)
    elif op == "&&":
        if cb is True:
            return a
        if ca is True:
            return b
    return Bin(op, a, b, dtype)


def call(fn: str, *args: ExprLike) -> Expr:
    """Apply math function ``fn`` (from :data:`CALLS`); folds constant ``max``/``min``."""
    if fn not in CALLS:
        raise ValueError(f"unknown expression function {fn!r}")
    xs = [as_expr(a) for a in args]
    like = next((x.dtype for x in xs if not isinstance(x, Const)), xs[0].dtype)
    xs = tuple(as_expr(a, like) if not isinstance(a, Expr) else a for a in args)
    if fn in ("max", "min") and all(isinstance(x, Const) for x in xs):
        return const(_PY[fn](*(x.value for x in xs)), like)
    if fn in _FOLD and len(xs) == 1 and isinstance(xs[0], Const) and like == "float32":
        # shader compilers reject constant expressions that overflow (log(0), exp(100)): fold them here
        import numpy as np

        with np.errstate(all="ignore"):
            return const(float(getattr(np, _FOLD[fn])(np.float32(xs[0].value))), like)
    return Call(fn, xs, CALL_DTYPES.get(fn, like))


def select(cond: Expr, t: ExprLike, f: ExprLike) -> Expr:
    """``t if cond else f`` (folded when ``cond`` is a constant)."""
    t = as_expr(t, f.dtype if isinstance(f, Expr) else "float32")
    f = as_expr(f, t.dtype)
    if isinstance(cond, Const):
        return t if cond.value else f
    return Select(cond, t, f, t.dtype)


def cast(x: Expr, dtype: str) -> Expr:
    """Convert ``x`` to ``dtype`` (no-op if it already is)."""
    if x.dtype == dtype:
        return x
    if isinstance(x, Const):
        return const(x.value, dtype)
    return Cast(x, dtype)


def reduce_axis(extent: int | Expr, name: str = "r") -> Var:
    """A fresh reduction axis ranging over ``[0, extent)`` (a run-time size expression allowed)."""
    return Var(f"{name}{next(_ids)}", extent if isinstance(extent, Expr) else int(extent))


def reduce(op: str, body: Expr, axes: list[Var] | tuple[Var, ...]) -> Expr:
    """``op`` (``sum``/``max``/``min``) of ``body`` over ``axes``; axes of extent 1 are substituted by 0."""
    keep = tuple(a for a in axes if not (isinstance(a.extent, int) and a.extent == 1))
    drop = {a: const(0, "int32") for a in axes if isinstance(a.extent, int) and a.extent == 1}
    if drop:
        body = substitute(body, drop)
    if not keep:
        return body
    return Reduce(op, body, keep, body.dtype)


def lowest(dtype: str) -> float:
    """The identity of ``max``: -inf for floats."""
    return -math.inf if dtype in FLOATS else -(2**31)


def highest(dtype: str) -> float:
    """The identity of ``min``: +inf for floats."""
    return math.inf if dtype in FLOATS else 2**31 - 1


def substitute(e: Expr, mapping: dict[Var, Expr]) -> Expr:
    """Replace variables in ``e`` by expressions, rebuilding with simplification."""
    return transform(e, lambda x: mapping.get(x) if isinstance(x, Var) else None)


def transform(e: Expr, fn) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn(node)`` may return a replacement for a node (before its children are visited)."""
    memo: dict[int, Expr] = {}

    def go(x: Expr) -> Expr:
        key = id(x)
        if key in memo:
            return memo[key]
        r = fn(x)
        if r is None:
            if isinstance(x, Bin):
                r = binop(x.op, go(x.a), go(x.b))
            elif isinstance(x, Call):
                r = call(x.fn, *(go(a) for a in x.args))
            elif isinstance(x, Select):
                r = select(go(x.cond), go(x.t), go(x.f))
            elif isinstance(x, Cast):
                r = cast(go(x.x), x.dtype)
            elif isinstance(x, Load):
                r = Load(x.tensor, tuple(go(i) for i in x.indices), x.dtype)
            elif isinstance(x, Reduce):
                r = reduce(x.op, go(x.body), x.axes)
            else:
                r = x
        memo[key] = r
        return r

    return go(e)


def children(x: Expr, into_reduce: bool = True, into_load: bool = True) -> tuple:
    """The operands of expression node ``x``: a load's indices and a reduction's body too, unless told not to."""
    if isinstance(x, Bin):
        return x.a, x.b
    if isinstance(x, Call):
        return tuple(x.args)
    if isinstance(x, Select):
        return x.cond, x.t, x.f
    if isinstance(x, Cast):
        return (x.x,)
    if isinstance(x, Load) and into_load:
        return tuple(x.indices)
    if isinstance(x, Reduce) and into_reduce:
        return (x.body,)
    return ()


def nodes(e: Expr, into_reduce: bool = True) -> Iterator[Expr]:
    """Every distinct node of ``e`` once (by identity), depth first, a node before its operands and operands left to
    right; with ``into_reduce`` false no reduction's body is entered. It rebuilds nothing (``transform`` rebuilds and
    simplifies every node it visits: too slow for analyses over whole attention expressions)."""
    seen: set[int] = set()
    todo = [e]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += reversed(children(x, into_reduce))


def free_vars(e: Expr) -> set[Var]:
    """The variables ``e`` mentions (axis, reduction and loop variables), inside loads' indices and reductions'
    bodies too."""
    return {x for x in nodes(e) if isinstance(x, Var)}


def reduces_in(e: Expr, outermost: bool = False) -> list[Reduce]:
    """The distinct :class:`Reduce` nodes of ``e`` (equal ones once), an outer one before those in its body; with
    ``outermost``, only those not nested in another reduction of ``e``."""
    return list(dict.fromkeys(x for x in nodes(e, not outermost) if isinstance(x, Reduce)))


def _affine(e: Expr, terms: dict[Expr, int], scale: int) -> int:
    """Add ``scale * e`` to ``terms`` (atom -> coefficient); return the constant part."""
    if isinstance(e, Const):
        return scale * int(e.value)
    if isinstance(e, Bin) and e.op in ("+", "-"):
        c = _affine(e.a, terms, scale)
        return c + _affine(e.b, terms, scale if e.op == "+" else -scale)
    if isinstance(e, Bin) and e.op == "*" and (isinstance(e.a, Const) or isinstance(e.b, Const)):
        k, x = (e.a, e.b) if isinstance(e.a, Const) else (e.b, e.a)
        return _affine(x, terms, scale * int(k.value))
    terms[e] = terms.get(e, 0) + scale
    return 0


def linear(e: Expr) -> Expr:
    """Integer ``e`` rewritten as a canonical sum ``c1*t1 + c2*t2 + ... + c0``.

    Sums and products by constants are distributed and like terms collected, with terms in a
    deterministic order, so index expressions that are equal as affine forms become equal
    structurally (``(i*4 + 1) + 2`` and ``i*4 + 3``), which common-subexpression elimination of
    loads relies on. Non-affine parts (``//``, ``%``, ``min``, products of variables) are atoms.
    """
    if e.dtype != "int32":
        return e
    terms: dict[Expr, int] = {}
    c0 = _affine(e, terms, 1)
    out: Expr = const(0, "int32")
    for t in sorted((t for t, k in terms.items() if k), key=lambda t: (terms[t] < 0, repr(t))):
        k = terms[t]
        out = binop("-", out, binop("*", t, -k)) if k < 0 and not isinstance(out, Const) else out + t * k
    if c0 > 0:
        out = binop("+", out, c0)
    elif c0 < 0:
        out = binop("-", out, -c0) if not (isinstance(out, Const)) else const(c0, "int32")
    return out


def _factors(e: Expr, num: list[Expr], den: list[Expr]) -> None:
    """Split float product ``e`` into the factors it multiplies (``num``) and divides by (``den``)."""
    if isinstance(e, Bin) and e.dtype in FLOATS and e.op in ("*", "/"):
        _factors(e.a, num, den)
        _factors(e.b, den if e.op == "/" else num, num if e.op == "/" else den)
    else:
        num.append(e)


def _product(fs: list[Expr], dtype: str) -> Expr:
    out: Expr = const(1, dtype)
    for f in fs:
        out = binop("*", out, f)
    return out


def hoist_factors(e: Expr, may_be_empty: Callable[[Expr], bool] | None = None) -> Expr:
    """``e`` with the factors of each float32 ``sum`` reduction's body that do not depend on its axes moved outside
    it: ``sum_k(a[k] * s / t) -> sum_k(a[k]) * s / t``. RMSNorm's ``x / rms(x) * g`` read by a product becomes the
    product of ``x * g`` scaled by ``1 / rms(x)`` after it, so that the two reductions over ``k`` (the statistic's and
    the product's) run side by side instead of one after the other; an attention's ``sum_k(exp(s_k - m) / l * v_k)``
    divides once by ``l``. Float16 sums are left alone (an unscaled partial sum may overflow where the scaled one
    does not); a body whose factors are all invariant is left alone too, and so is a sum over a run-time extent that
    may be 0 (its value is 0 whatever its factors: ``0 * s / t`` would be NaN for ``t`` 0): ``may_be_empty(extent)``
    says which run-time extents may be (default: all; :func:`kiln.codegen.lowering.group_expr` asks their bounds)."""

    def empty(extent: Any) -> bool:
        return extent < 1 if isinstance(extent, int) else may_be_empty is None or may_be_empty(extent)

    def fn(x: Expr) -> Expr | None:
        if not isinstance(x, Reduce):
            return None
        body = hoist_factors(x.body, may_be_empty)
        if x.op != "sum" or x.dtype != "float32" or any(empty(ax.extent) for ax in x.axes):
            return reduce(x.op, body, x.axes)
        num: list[Expr] = []
        den: list[Expr] = []
        _factors(body, num, den)
        axes = set(x.axes)
        moves = [not (free_vars(f) & axes) for f in num + den]
        if not any(moves) or all(moves[:len(num)]):
            return reduce(x.op, body, x.axes)
        keep_num = [f for f, m in zip(num, moves) if not m]
        keep_den = [f for f, m in zip(den, moves[len(num):]) if not m]
        out_num = [f for f, m in zip(num, moves) if m]
        out_den = [f for f, m in zip(den, moves[len(num):]) if m]
        inner = binop("/", _product(keep_num, x.dtype), _product(keep_den, x.dtype)) if keep_den else \
            _product(keep_num, x.dtype)
        out = binop("*", reduce("sum", inner, x.axes), _product(out_num, x.dtype))
        return binop("/", out, _product(out_den, x.dtype)) if out_den else out

    return transform(e, fn)
