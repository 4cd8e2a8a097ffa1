"""Shape arithmetic over run-time size symbols (dynamic dims).

A dim of a :class:`~kiln.ir.graph.Value` is an ``int`` or an integer expression over
:class:`~kiln.arith.expr.SizeVar` symbols (``seq``, ``batch * seq``, ``seq - 1``): the same expression
language kernels are written in, so a shape flows unchanged into loop bounds and index arithmetic.

This module keeps dims canonical (:func:`simplify`: a sum of monomials in a fixed order, so equal
polynomials compare equal structurally), bounds them (:func:`bounds`, interval arithmetic from
the symbols' ``lo``/``hi``), decides comparisons only when the bounds prove them (:func:`decide`,
KilnError otherwise: never a silently chosen branch), evaluates them (:func:`evaluate`, also over
numpy arrays) and serialises them to the manifest's small JSON form (:func:`to_json`). Design and
limits: docs/dynamic-shapes.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from kiln.arith.expr import Bin, Call, Const, Expr, SizeVar, binop, call, const
from kiln.errors import KilnError, ShapeError

Dim = int | Expr


def is_symbolic(d: Any) -> bool:
    """True for a dim that is an expression over size symbols (not a plain int)."""
    return isinstance(d, Expr)


def is_static(shape: Iterable[Dim]) -> bool:
    """True when every dim of ``shape`` is an int."""
    return not any(isinstance(d, Expr) for d in shape)


def symbols(e: Any) -> list[SizeVar]:
    """The size symbols ``e`` (a dim, a shape, or an object array of dims) mentions, by index."""
    found: dict[str, SizeVar] = {}

    def visit(x):
        if isinstance(x, SizeVar):
            found[x.name] = x
        elif isinstance(x, Bin):
            visit(x.a)
            visit(x.b)
        elif isinstance(x, Call):
            for a in x.args:
                visit(a)
        elif isinstance(x, (tuple, list)):
            for a in x:
                visit(a)
        elif isinstance(x, np.ndarray) and x.dtype == object:
            for a in x.reshape(-1):
                visit(a)

    visit(e)
    return sorted(found.values(), key=lambda s: s.index)


# ----------------------------------------------------------------------------- canonical form
def _quotient(s: SizeVar) -> Expr:
    """The atom ``s // s.multiple`` of a dim declared a multiple (``s`` is ``multiple * quotient``)."""
    return Bin("//", s, const(s.multiple, "int32"), "int32")


def _poly(e: Expr) -> dict[tuple[Expr, ...], int]:
    """``e`` as a polynomial: sorted tuple of atoms (symbols, non-polynomial terms) -> coefficient.

    A dim declared a multiple of ``m`` is the monomial ``m * (s // m)``, so ``(s - 1) // 2 + 1`` folds to
    ``s // 2`` when ``m`` is even (the shape arithmetic of stride-2 convolutions over such a dim).
    """
    if isinstance(e, Const):
        return {(): int(e.value)}
    if isinstance(e, SizeVar) and e.multiple > 1:
        return {(_quotient(e),): e.multiple}
    if isinstance(e, Bin) and e.op == "//" and isinstance(e.a, SizeVar) and e.a.multiple > 1 \
            and isinstance(e.b, Const) and int(e.b.value) == e.a.multiple:
        return {(e,): 1}
    if isinstance(e, Bin) and e.op in ("+", "-"):
        out = dict(_poly(e.a))
        for m, c in _poly(e.b).items():
            out[m] = out.get(m, 0) + (c if e.op == "+" else -c)
        return {m: c for m, c in out.items() if c}
    if isinstance(e, Bin) and e.op == "*":
        out: dict[tuple[Expr, ...], int] = {}
        for (ma, ca), (mb, cb) in itertools.product(_poly(e.a).items(), _poly(e.b).items()):
            m = tuple(sorted(ma + mb, key=repr))
            out[m] = out.get(m, 0) + ca * cb
        return {m: c for m, c in out.items() if c}
    if isinstance(e, SizeVar):
        return {(e,): 1}
    a = _atom(e)
    if isinstance(a, (Const, SizeVar)) or isinstance(a, Bin) and a.op in ("+", "-", "*"):
        return _poly(a)  # an atom that folded to a polynomial (``(2 * s + 1) // 2`` is ``s``)
    return {(a,): 1}


def _atom(e: Expr) -> Expr:
    """A non-polynomial term with simplified operands (``//``, ``%``, ``max``, ``min`` of dims)."""
    if isinstance(e, Bin) and e.op in ("//", "%"):
        a, b = simplify(e.a), simplify(e.b)
        if isinstance(b, int) and b > 0:
            p = _poly(_expr(a))
            if all(c % b == 0 for c in p.values()):  # exact: (b * x) // b, (b * x) % b
                return _expr(simplify(_from_poly({m: c // b for m, c in p.items()}))) if e.op == "//" \
                    else const(0, "int32")
            # a = b * q + r, the multiples of b taken out of the symbolic monomials' coefficients:
            # a // b = q + r // b and a % b = r % b (floor division, exact for integers)
            q = {m: c // b for m, c in p.items() if m and c // b}
            if q:
                r = _expr(simplify(_from_poly({m: (c % b if m else c) for m, c in p.items()})))
                rest = _atom(binop(e.op, r, _expr(b)))
                return _expr(simplify(_from_poly(q) + rest)) if e.op == "//" else rest
            lo, hi = bounds(a)
            if 0 <= lo and hi < b:  # a // b == 0, a % b == a
                return const(0, "int32") if e.op == "//" else _expr(a)
            if lo == hi:  # a constant (after the multiples were taken out)
                return const(lo // b if e.op == "//" else lo % b, "int32")
        return binop(e.op, _expr(a), _expr(b))
    if isinstance(e, Call) and e.fn in ("max", "min"):
        a, b = simplify(e.args[0]), simplify(e.args[1])
        if a == b:
            return _expr(a)
        (la, ha), (lb, hb) = bounds(a), bounds(b)
        if e.fn == "max":
            if la >= hb:
                return _expr(a)
            if lb >= ha:
                return _expr(b)
        else:
            if ha <= lb:
                return _expr(a)
            if hb <= la:
                return _expr(b)
        return call(e.fn, _expr(a), _expr(b))
    return e


def _from_poly(p: dict[tuple[Expr, ...], int]) -> Expr:
    out: Expr = const(0, "int32")
    for m in sorted(p, key=lambda m: (len(m) == 0, -len(m), repr(m))):
        c = p[m]
        if not c:
            continue
        term: Expr = const(1, "int32")
        for a in m:
            term = term * a
        if isinstance(out, Const) and out.value == 0:
            out = term * c
        elif c < 0:
            out = binop("-", out, term * -c)
        else:
            out = out + term * c
    return out


def _expr(d: Dim) -> Expr:
    return d if isinstance(d, Expr) else const(int(d), "int32")


def simplify(d: Dim) -> Dim:
    """``d`` in canonical form: an int when constant, else a sum of monomials in a fixed order.

    Equal polynomials in the size symbols become structurally equal (``seq * batch`` and
    ``batch * seq``); ``//`` and ``%`` by a dividing constant fold, and ``max``/``min`` fold when the
    symbols' bounds decide them.
    """
    if not isinstance(d, Expr):
        return int(d)
    if d.dtype != "int32":
        raise KilnError(f"a size expression must be an integer, got {d.dtype} ({d})")
    e = _from_poly(_poly(d))
    return int(e.value) if isinstance(e, Const) else e


def shape(dims: Iterable[Dim]) -> tuple[Dim, ...]:
    """A shape with every dim simplified (ints stay ints)."""
    return tuple(simplify(d) for d in dims)


def prod(dims: Iterable[Dim]) -> Dim:
    """The product of ``dims`` (an int when all are ints)."""
    n: Dim = 1
    for d in dims:
        n = n * d
    return simplify(n)


def ceil_div(a: Dim, b: int) -> Dim:
    """``ceil(a / b)`` for ``a >= 0`` and an int ``b > 0``."""
    if not isinstance(a, Expr):
        return -(-int(a) // b)
    return simplify((a + (b - 1)) // b) if b != 1 else a


# ----------------------------------------------------------------------------- bounds and decisions
def bounds(d: Dim) -> tuple[int, int]:
    """Interval ``(lo, hi)`` containing every value of ``d`` over the symbols' bounds (interval arithmetic)."""
    if not isinstance(d, Expr):
        return int(d), int(d)
    if isinstance(d, Const):
        return int(d.value), int(d.value)
    if isinstance(d, SizeVar):
        return d.lo, d.hi
    if isinstance(d, Bin):
        (la, ha), (lb, hb) = bounds(d.a), bounds(d.b)
        if d.op == "+":
            return la + lb, ha + hb
        if d.op == "-":
            return la - hb, ha - lb
        if d.op == "*":
            c = [la * lb, la * hb, ha * lb, ha * hb]
            return min(c), max(c)
        if d.op == "//" and lb > 0 and la >= 0:
            return la // hb, ha // lb
        if d.op == "%" and lb > 0 and la >= 0:
            return 0, min(ha, hb - 1)
    if isinstance(d, Call) and d.fn in ("max", "min"):
        (la, ha), (lb, hb) = bounds(d.args[0]), bounds(d.args[1])
        return (max(la, lb), max(ha, hb)) if d.fn == "max" else (min(la, lb), min(ha, hb))
    raise KilnError(f"cannot bound size expression {d}")


def _decided(op: str, lo: int, hi: int) -> bool | None:
    """``v op 0`` for every ``v`` in ``[lo, hi]``: True, False, or None when it varies."""
    table = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0),
             "==": (lo == hi == 0, lo > 0 or hi < 0), "!=": (lo > 0 or hi < 0, lo == hi == 0)}
    yes, no = table[op]
    return True if yes else False if no else None


def decide(op: str, a: Dim, b: Dim, what: str = "") -> bool:
    """``a op b`` (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``) when it holds, or fails, for every value in
    the symbols' bounds.

    Raises:
        KilnError: the answer depends on run-time values (names the expressions, the dims and ``what``).
    """
    lo, hi = bounds(simplify(_expr(a) - _expr(b)))
    r = _decided(op, lo, hi)
    if r is not None:
        return r
    names = ", ".join(f"{s.name} in [{s.lo}, {s.hi}]" for s in symbols((a, b)))
    raise KilnError(f"{what + ': ' if what else ''}{to_text(a)} {op} {to_text(b)} depends on the run-time "
                    f"dims ({names}); bind them with --dim NAME=SIZE")


def broadcast_dim(a: Dim, b: Dim, what: str = "broadcast") -> Dim:
    """The numpy/ONNX broadcast of two dims (one of them 1, or both equal).

    Raises:
        ShapeError: the dims differ and neither is 1 (also when that can only be known at run time).
    """
    if not is_symbolic(a) and not is_symbolic(b):
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        raise ShapeError(f"{what}: dims {a} and {b} do not broadcast")
    if not is_symbolic(a) and a == 1:
        return b
    if not is_symbolic(b) and b == 1:
        return a
    if simplify(_expr(a) - _expr(b)) == 0:
        return simplify(a)
    raise ShapeError(f"{what}: dims {to_text(a)} and {to_text(b)} do not broadcast (only equal dims or 1 are "
                     "supported for run-time dims)")


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Numpy/ONNX multidirectional broadcast of shapes with symbolic dims (ShapeError if they do not fit)."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        for i, d in enumerate(s):
            k = rank - len(s) + i
            try:
                out[k] = broadcast_dim(out[k], d)
            except ShapeError:
                raise ShapeError(f"shapes {' and '.join(format_shape(x) for x in shapes)} do not broadcast") from None
    return tuple(out)


# ----------------------------------------------------------------------------- evaluation and serialisation
_EVAL = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
         "//": lambda a, b: a // b, "%": lambda a, b: a % b}


def evaluate(d: Dim, env: Mapping[str, Any]) -> Any:
    """The value of ``d`` with each symbol's value from ``env`` (name -> int or numpy array).

    ``//`` and ``%`` are floor division and remainder (shape expressions are never negative there).

    Raises:
        KilnError: a symbol missing from ``env``.
    """
    if not isinstance(d, Expr):
        return d
    if isinstance(d, Const):
        return int(d.value)
    if isinstance(d, SizeVar):
        if d.name not in env:
            raise KilnError(f"no value for run-time dim {d.name!r}")
        return env[d.name]
    if isinstance(d, Bin) and d.op in _EVAL:
        return _EVAL[d.op](evaluate(d.a, env), evaluate(d.b, env))
    if isinstance(d, Call) and d.fn in ("max", "min"):
        fn = np.maximum if d.fn == "max" else np.minimum
        return fn(evaluate(d.args[0], env), evaluate(d.args[1], env))
    raise KilnError(f"cannot evaluate size expression {d}")


def upper(d: Dim, syms: Iterable[SizeVar] | None = None) -> int:
    """The largest value of ``d`` for the symbols in their bounds: exact, by evaluating ``d`` on every integer
    point of the box when it has at most 2^20 points (vectorised), else the largest over its corners and
    the bounds' interval (docs/dynamic-shapes.md)."""
    if not isinstance(d, Expr):
        return int(d)
    return _upper(d, tuple(syms) if syms is not None else tuple(symbols(d)))


@functools.lru_cache(maxsize=8192)
def _upper(d: Expr, syms: tuple[SizeVar, ...]) -> int:
    """:func:`upper`, remembered: a row kernel's analysis asks for the same bounds many times, and a grid of up to
    2^20 points takes milliseconds (SmolLM2's compile spent 10 of its 60 s here). Dims compare and hash by their
    bounds too, so an answer is never reused for other bounds."""
    points = 1
    for s in syms:
        points *= s.hi - s.lo + 1
    if points <= 1 << 20:  # the values each dim takes: its multiples in bounds
        grids = np.meshgrid(*[np.arange(-(-s.lo // s.multiple) * s.multiple, s.hi + 1, s.multiple, dtype=np.int64)
                              for s in syms], indexing="ij")
        return int(np.max(evaluate(d, {s.name: g for s, g in zip(syms, grids)})))
    corners = itertools.product(*[(s.lo, s.hi) for s in syms])
    return max(max(int(evaluate(d, {s.name: v for s, v in zip(syms, c)})) for c in corners), 0)


_JSON_OPS = ("+", "-", "*", "//", "%", "max", "min")


def to_json(d: Dim) -> Any:
    """``d`` as the manifest's expression form: an int, a dim name, or ``[op, a, b]`` with ``op`` one of
    ``+ - * // % max min`` (integer arithmetic; ``//`` floors). Runtimes evaluate it with a small
    interpreter (:func:`kiln.runtime.dynamic.eval_json`, ``evalDims`` in webgpu.js), never ``eval``."""
    if not isinstance(d, Expr):
        return int(d)
    if isinstance(d, Const):
        return int(d.value)
    if isinstance(d, SizeVar):
        return d.name
    if isinstance(d, Bin) and d.op in _JSON_OPS:
        return [d.op, to_json(d.a), to_json(d.b)]
    if isinstance(d, Call) and d.fn in ("max", "min"):
        return [d.fn, to_json(d.args[0]), to_json(d.args[1])]
    raise KilnError(f"cannot serialise size expression {d}")


def to_text(d: Dim) -> str:
    """A readable form of a dim (``batch*seq``, ``seq-1``)."""
    if not isinstance(d, Expr):
        return str(d)
    if isinstance(d, Const):
        return str(d.value)
    if isinstance(d, SizeVar):
        return d.name
    if isinstance(d, Bin):
        a, b = to_text(d.a), to_text(d.b)
        if d.op in ("*", "//", "%"):
            a = f"({a})" if isinstance(d.a, Bin) and d.a.op in ("+", "-") else a
            b = f"({b})" if isinstance(d.b, Bin) else b
        return f"{a}{d.op}{b}" if d.op in ("*", "//") else f"{a} {d.op} {b}"
    if isinstance(d, Call):
        return f"{d.fn}({', '.join(to_text(a) for a in d.args)})"
    return repr(d)


def format_shape(shape: Iterable[Dim]) -> str:
    """``[batch, seq, 384]``."""
    return "[" + ", ".join(to_text(d) for d in shape) + "]"


def concrete(shape: Iterable[Dim], env: Mapping[str, int]) -> tuple[int, ...]:
    """``shape`` with every dim evaluated for dim values ``env``."""
    return tuple(int(evaluate(d, env)) for d in shape)


#: the upper bound of a growable dim (one the user gave no bound): large enough never to be met in practice,
#: small enough that bounds arithmetic stays cheap; buffers are sized at run time, never for it
GROW_HI = 1 << 24


def size_var(name: str, index: int, lo: int, hi: int | None, opt: int | None = None, multiple: int = 1) -> SizeVar:
    """A run-time dim ``name`` with bounds ``lo..hi`` (``0 <= lo <= hi``), schedule value ``opt`` (default ``hi``)
    and, when ``multiple > 1``, the constraint that every value is a multiple of ``multiple`` (the bounds and
    ``opt`` must be multiples too; runtimes refuse other values). ``hi=None`` makes a *growable* dim
    (``SizeVar.grow``): bounded by :data:`GROW_HI`, ``opt`` by default ``max(lo, 1)`` (kernels over it also get a
    variant scheduled at 64: kiln.codegen.target.variant_values), the buffers it sizes growing at run time.

    Raises:
        KilnError: bad bounds.
    """
    grow = hi is None
    if grow:
        hi = GROW_HI // multiple * multiple
        opt = max(lo, 1) if opt is None else opt
        opt = -(-opt // multiple) * multiple
    opt = hi if opt is None else opt
    if not (0 <= lo <= hi and lo <= opt <= hi):
        raise KilnError(f"dim {name!r}: bounds must satisfy 0 <= lo <= opt <= hi, got {lo}..{hi}@{opt}")
    if hi >= 2**31:
        raise KilnError(f"dim {name!r}: upper bound {hi} does not fit in int32")
    if multiple < 1 or any(v % multiple for v in (lo, hi, opt)):
        raise KilnError(f"dim {name!r}: bounds {lo}..{hi}@{opt} must be multiples of {multiple} (%{multiple})")
    return SizeVar(name, index, int(lo), int(hi), int(opt), multiple=int(multiple), grow=grow)


def grows(d: Dim) -> bool:
    """Whether ``d`` depends on a growable dim (:attr:`SizeVar.grow`): a buffer it sizes grows at run time."""
    return any(s.grow for s in symbols(d))


def planned(d: Dim) -> int:
    """The value ``d`` is planned for: its upper bound (:func:`upper`), or, when it grows with a growable dim, the
    largest value with the growable dims at their lower bound (a growable buffer's first size: the runtimes evaluate
    ``d`` for each run and grow it)."""
    if not grows(d):
        return upper(d)
    syms = symbols(d)
    low = {s.name: s.lo for s in syms if s.grow}
    others = [s for s in syms if not s.grow]
    return max(int(evaluate(d, {**low, **{s.name: v for s, v in zip(others, c)}}))
               for c in itertools.product(*[(s.lo, s.hi) for s in others]))


def max_terms(d: Dim) -> list[Dim]:
    """The operands of a nest of ``max`` calls (``[d]`` for anything else)."""
    if isinstance(d, Call) and d.fn == "max":
        return [t for a in d.args for t in max_terms(a)]
    return [d]


def max_of(terms: Iterable[Dim]) -> Dim:
    """``max`` of ``terms`` without those another one bounds (``4*batch*seq`` under ``1536*batch*seq``, for every
    value of the dims in bounds)."""
    keep: list[Dim] = []
    for t in terms:
        if any(bounds(simplify(_expr(k) - _expr(t)))[0] >= 0 for k in keep):
            continue
        keep = [k for k in keep if bounds(simplify(_expr(t) - _expr(k)))[0] < 0] + [t]
    out = keep[0]
    for t in keep[1:]:
        out = simplify(call("max", _expr(out), _expr(t)))
    return out


class BoundInferred(KilnError):
    """Raised while importing a model when a growable dim needs an upper bound the model implies (a Slice of a
    512-row position table by ``seq`` gives ``seq <= 512``): the importer converts the model again with the dim
    bounded (:attr:`dim`, :attr:`hi`) and reports why (the message)."""

    def __init__(self, dim: str, hi: int, why: str):
        super().__init__(why)
        self.dim, self.hi = dim, hi


#: run-time dim name -> the value :func:`at_opt` takes for it instead of its ``opt`` (see :func:`opt_values`)
_OPT_OVERRIDE: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("kiln_opt_override",
                                                                                     default=None)


def at_variant_top(d: Dim) -> int:
    """``d`` with the dims an enclosing :func:`opt_values` names at their upper bound and the others at their
    ``opt``: the largest size a plan step's variant runs at (its schedule is chosen at :func:`at_opt`, but a
    choice that pays only for large sizes, such as shared tiles, may look here)."""
    over = _OPT_OVERRIDE.get() or {}
    return int(evaluate(d, {s.name: s.hi if s.name in over else s.opt for s in symbols(d)}))


def at_opt(d: Dim) -> int:
    """``d`` evaluated at every symbol's ``opt`` value (what default schedules are chosen for), or at the values
    an enclosing :func:`opt_values` gives."""
    over = _OPT_OVERRIDE.get() or {}
    return int(evaluate(d, {s.name: over.get(s.name, s.opt) for s in symbols(d)}))


def opt_overrides() -> tuple[tuple[str, int], ...]:
    """The dims' values :func:`opt_values` sets at this point, sorted (empty outside its blocks)."""
    return tuple(sorted((_OPT_OVERRIDE.get() or {}).items()))


@contextlib.contextmanager
def opt_values(values: dict[str, int]):
    """Within the ``with`` block, :func:`at_opt` evaluates the named dims at ``values`` (schedules chosen for
    another point of the dims' range: a plan step's variant, docs/dynamic-shapes.md)."""
    token = _OPT_OVERRIDE.set({**(_OPT_OVERRIDE.get() or {}), **values})
    try:
        yield
    finally:
        _OPT_OVERRIDE.reset(token)


# ----------------------------------------------------------------------------- shape rules of ONNX converters
def exact_div(a: Dim, b: Dim, what: str = "") -> Dim:
    """``a / b`` when ``b`` divides ``a`` as polynomials: each monomial of ``a`` by ``b``'s one monomial, or ``a`` a
    constant multiple of ``b``.

    Raises:
        ShapeError: the division is not exact for every value of the dims.
    """
    a, b = simplify(a), simplify(b)
    if not is_symbolic(a) and not is_symbolic(b):
        if b == 0 or a % b:
            raise ShapeError(f"{what}: {a} is not divisible by {b}")
        return a // b
    pb = _poly(_expr(b))
    if len(pb) == 1:
        (mb, cb), = pb.items()
        out: dict[tuple[Expr, ...], int] = {}
        for m, c in _poly(_expr(a)).items():
            rest = list(m)
            for x in mb:
                if x not in rest:
                    break
                rest.remove(x)
            else:
                if cb and c % cb == 0:
                    out[tuple(rest)] = c // cb
                    continue
            break
        else:
            return simplify(_from_poly(out))
    else:  # a constant multiple of a polynomial: (9p + 9s) / (p + s)
        pa = _poly(_expr(a))
        ratios = {c // pb[m] if m in pb and pb[m] and c % pb[m] == 0 else None for m, c in pa.items()}
        if pa.keys() == pb.keys() and len(ratios) == 1 and None not in ratios:
            return ratios.pop()
    raise ShapeError(f"{what}: {to_text(a)} is not divisible by {to_text(b)} for every value of the run-time dims")


def resolve_reshape(src: tuple[Dim, ...], target: list[Dim], allowzero: int = 0) -> tuple[Dim, ...]:
    """ONNX Reshape's target shape with size expressions: 0 copies the input dim (unless ``allowzero``), one -1
    is inferred by exact polynomial division.

    Raises:
        ShapeError: more than one -1, or the element counts differ.
    """
    out: list[Dim] = []
    for i, d in enumerate(target):
        if not is_symbolic(d) and int(d) == 0 and not allowzero:
            out.append(src[i])
        else:
            out.append(simplify(d))
    holes = [i for i, d in enumerate(out) if not is_symbolic(d) and d == -1]
    if len(holes) > 1:
        raise ShapeError(f"Reshape: more than one -1 in {format_shape(target)}")
    total = prod(src)
    if holes:
        known = prod(d for i, d in enumerate(out) if i != holes[0])
        out[holes[0]] = exact_div(total, known, f"Reshape {format_shape(src)} to {format_shape(target)}")
    if prod(out) != total:
        raise ShapeError(f"Reshape: cannot reshape {format_shape(src)} to {format_shape(target)}")
    return tuple(out)


def _clamp(x: Dim, lo: Dim, hi: Dim) -> Dim:
    return simplify(call("min", call("max", _expr(x), _expr(lo)), _expr(hi)))


def clamp_slice(start: Dim, end: Dim, dim: Dim, step: int) -> tuple[Dim, Dim]:
    """ONNX Slice's ``start``/``end`` on an axis of extent ``dim`` (negative values count from the end, then clamped),
    with size expressions; a clamp the bounds cannot decide stays in the expression as ``min``/``max``.

    Raises:
        KilnError: a start or end whose sign depends on the run-time dims.
        BoundInferred: an end over one growable dim past a static extent (``x[:, :seq]`` of a 512-row table): the dim
            is at most the largest value that stays inside (the model works only there).
    """
    def from_end(x: Dim) -> Dim:
        if not is_symbolic(x):
            x = int(x)
            if x >= 2**31 - 1:
                return dim if step > 0 else x
            if x <= -(2**31):
                return -1 if step < 0 else 0
            return simplify(_expr(x) + _expr(dim)) if x < 0 else x
        return simplify(_expr(x) + _expr(dim)) if decide("<", x, 0, "Slice") else x

    s, e = from_end(start), from_end(end)
    if step > 0:
        _infer_within(e, dim)
        return _clamp(s, 0, dim), _clamp(e, 0, dim)
    top = simplify(_expr(dim) - 1)
    return _clamp(s, -1, top), _clamp(e, -1, top)


def _infer_within(x: Dim, extent: Dim) -> None:
    """Raise :class:`BoundInferred` when ``x <= extent`` is undecided, ``extent`` is static and ``x`` grows with one
    growable dim that is inside for its lower bound: the largest value of the dim keeping ``x <= extent``."""
    syms = symbols(x)
    if is_symbolic(extent) or len(syms) != 1 or not syms[0].grow:
        return
    s, extent = syms[0], int(extent)
    if bounds(simplify(_expr(x) - extent))[1] <= 0:
        return
    at = lambda v: int(evaluate(x, {s.name: v}))
    lo, hi = s.lo, s.hi
    if at(lo) > extent or at(hi) <= extent:
        return
    while hi - lo > 1:  # the largest value inside (x grows with the dim: shape arithmetic is monotone)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= extent else (lo, mid)
    lo -= lo % s.multiple
    raise BoundInferred(s.name, lo, f"{s.name} <= {lo}: a Slice ends at {to_text(x)} on an axis of {extent}")


def slice_len_expr(start: Dim, end: Dim, step: int) -> Dim:
    """Elements of ``range(start, end, step)`` as a size expression: ``max(ceil((end - start) / step), 0)``."""
    span = _expr(end) - _expr(start) if step > 0 else _expr(start) - _expr(end)
    return ceil_div(simplify(call("max", simplify(span) if is_symbolic(simplify(span)) else _expr(simplify(span)),
                                  const(0, "int32"))), abs(step))
