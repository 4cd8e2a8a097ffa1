"""Lowering: a scheduled tensor expression to a small imperative kernel IR.

The kernel IR is target-neutral: a list of statements run by each invocation,
over flat buffer parameters. Each target's codegen renders it (WGSL in
:mod:`kiln.codegen.wgsl`). Lowering

1. gives each invocation one flat output index ``gid`` and unravels it into the output axes,
2. hoists every :class:`~kiln.te.expr.Reduce` into an accumulator and nested loops (equal
   reductions are computed once),
3. turns multi-dimensional loads into flat buffer loads, guarding the loads inside the
   taken branch of a :class:`~kiln.te.expr.Select` (for example a padded convolution's
   border) so they never read out of bounds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from kiln.te.compute import Tensor, placeholders
from kiln.te.expr import (
    Bin,
    Call,
    Cast,
    Expr,
    Load,
    Reduce,
    Select,
    Var,
    binop,
    call,
    cast,
    const,
    highest,
    lowest,
    select,
    transform,
)
from kiln.te.schedule import Schedule


@dataclass(frozen=True, eq=True)
class BufLoad(Expr):
    """Element ``index`` of flat buffer parameter ``buf``; ``guard`` clamps the index into ``[0, size)``."""

    buf: str
    index: Expr
    size: int
    guard: bool
    dtype: str


@dataclass
class Let:
    """An immutable local: ``let name = value``."""

    var: Var
    value: Expr


@dataclass
class Decl:
    """A mutable local with an initial value."""

    var: Var
    value: Expr


@dataclass
class Assign:
    """``var = value``."""

    var: Var
    value: Expr


@dataclass
class For:
    """``for var in [0, extent)``."""

    var: Var
    extent: int
    body: list = field(default_factory=list)


@dataclass
class Store:
    """``buf[index] = value``."""

    buf: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Param:
    """A buffer parameter of a kernel: binding position is its index in ``LoweredKernel.params``."""

    name: str
    dtype: str
    size: int
    access: str  # "read" or "read_write"


@dataclass
class LoweredKernel:
    """A kernel ready for codegen.

    Attributes:
        name: entry-point-friendly name.
        params: buffers in binding order (inputs first, then the output).
        inputs: the placeholder each input param was made from (same order as ``params[:-1]``).
        total: invocations that do work (output elements).
        gid: the variable holding the invocation's flat output index.
        body: statements run when ``gid < total``.
        schedule: the schedule it was lowered with.
    """

    name: str
    params: list[Param]
    inputs: list[Tensor]
    total: int
    gid: Var
    body: list
    schedule: Schedule

    @property
    def dispatch(self) -> tuple[int, int, int]:
        """Workgroup counts of the dispatch."""
        return self.schedule.dispatch(self.total)


def _ravel(indices, shape) -> Expr:
    flat: Expr = const(0, "int32")
    for i, d in zip(indices, shape):
        flat = flat * d + i
    return flat


def canonical(out: Tensor) -> Tensor:
    """``out`` with its axes renamed ``i0, i1, ...`` and reduction axes ``r0, r1, ...`` in first-use order.

    Two kernels that differ only in variable names then render to the same source and
    are deduplicated.
    """
    names: dict[Var, Var] = {a: Var(f"i{k}") for k, a in enumerate(out.axes)}

    def rename(x):
        if isinstance(x, Var):
            return names.get(x)
        if isinstance(x, Reduce):
            for a in x.axes:
                names.setdefault(a, Var(f"r{len(names) - len(out.axes)}", a.extent))
            return Reduce(x.op, transform(x.body, rename), tuple(names[a] for a in x.axes), x.dtype)
        return None

    body = transform(out.body, rename)
    return Tensor(out.name, out.shape, out.dtype, tuple(names[a] for a in out.axes), body, out.attrs)


def lower(out: Tensor, schedule: Schedule | None = None, name: str | None = None) -> LoweredKernel:
    """Lower computed tensor ``out`` (producers already inlined) under ``schedule`` (default :class:`Schedule`)."""
    schedule = schedule or Schedule()
    out = canonical(out)
    ins = placeholders(out)
    pname = {id(t): f"in{k}" for k, t in enumerate(ins)}
    params = [Param(pname[id(t)], t.dtype, t.size, "read") for t in ins]
    params.append(Param("out", out.dtype, out.size, "read_write"))
    gid = Var("gid")
    body: list = []
    # unravel the flat invocation index into the output axes
    stride = out.size
    for ax, d in zip(out.axes, out.shape):
        stride //= d
        if d == 1:
            body.append(Let(ax, const(0, "int32")))
            continue
        v = gid // stride if stride != 1 else gid
        if stride * d != out.size:
            v = v % d
        body.append(Let(ax, v))
    counter = itertools.count()

    def flat(e: Expr, guarded: bool) -> Expr:
        if isinstance(e, Load):
            idx = _ravel([flat(i, guarded) for i in e.indices], e.tensor.shape)
            return BufLoad(pname[id(e.tensor)], idx, e.tensor.size, guarded and e.tensor.size > 0, e.dtype)
        if isinstance(e, Bin):
            return binop(e.op, flat(e.a, guarded), flat(e.b, guarded))
        if isinstance(e, Call):
            return call(e.fn, *(flat(a, guarded) for a in e.args))
        if isinstance(e, Select):
            return select(flat(e.cond, guarded), flat(e.t, True), flat(e.f, guarded))
        if isinstance(e, Cast):
            return cast(flat(e.x, guarded), e.dtype)
        if isinstance(e, Reduce):
            raise TypeError("reductions are hoisted before flattening")
        return e

    def hoist(e: Expr, block: list, memo: dict) -> Expr:
        """Emit statements computing every Reduce in ``e`` into ``block``; return ``e`` over accumulators."""
        if isinstance(e, Reduce):
            if e in memo:
                return memo[e]
            acc = Var(f"acc{next(counter)}", 0, e.dtype)
            init = {"sum": 0.0 if e.dtype == "float32" else 0, "max": lowest(e.dtype), "min": highest(e.dtype),
                    "prod": 1}[e.op]
            block.append(Decl(acc, const(init, e.dtype)))
            inner = block
            for ax in e.axes:
                loop = For(ax, ax.extent)
                inner.append(loop)
                inner = loop.body
            v = hoist(e.body, inner, {})
            comb = acc + v if e.op == "sum" else acc * v if e.op == "prod" else call(e.op, acc, v)
            inner.append(Assign(acc, flat(comb, False)))
            memo[e] = acc
            return acc
        if isinstance(e, Bin):
            return binop(e.op, hoist(e.a, block, memo), hoist(e.b, block, memo))
        if isinstance(e, Call):
            return call(e.fn, *(hoist(a, block, memo) for a in e.args))
        if isinstance(e, Select):
            return select(hoist(e.cond, block, memo), hoist(e.t, block, memo), hoist(e.f, block, memo))
        if isinstance(e, Cast):
            return cast(hoist(e.x, block, memo), e.dtype)
        if isinstance(e, Load):
            return Load(e.tensor, tuple(hoist(i, block, memo) for i in e.indices), e.dtype)
        return e

    value = hoist(out.body, body, {})
    body.append(Store("out", gid, flat(value, False)))
    return LoweredKernel(name or out.name, params, ins, out.size, gid, body, schedule)


__all__ = ["Assign", "BufLoad", "Decl", "For", "Let", "LoweredKernel", "Param", "Store", "canonical", "lower"]
