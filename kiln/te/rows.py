"""Row kernels: row reductions and the elementwise work over the same rows in one kernel.

LayerNormalization (mean, variance, normalise) and Softmax (max, sum of exponentials, divide)
reduce each row of their input and then compute every element of that row from the row's
statistics. Fused into one group (:func:`kiln.passes.fusion.fuse_rows`), the inlined tensor
expression reads as ``out[row, col] = f(x[row, col], R1[row], R2[row], ...)`` where the
reductions ``R`` depend only on the *row axes* of the output and may nest (the variance reduces
``(x - mean)^2``, whose mean is itself a reduction). Lowered element by element that would
recompute every reduction for every output element; :func:`lower_rows` instead gives each row
one workgroup (schedule ``rows``, ``reduce_lanes == workgroup_size``):

1. reductions are computed level by level (a reduction after those nested in its body): each
   lane accumulates a strided share of the outermost reduction axis, the partial results are
   tree-combined through workgroup memory (:func:`kiln.te.loops.combine_lanes`) and every lane
   then holds the row's value;
2. each lane computes and stores a strided share of the row's outputs (coalesced stores),
   reading the reductions from registers.

Everything is still the one tensor expression of the group; only its schedule differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.arith.expr import Expr, Reduce, Var, binop, call, free_vars, linear, transform
from kiln.arith.symbolic import ceil_div, is_symbolic, simplify, upper
from kiln.te.compute import Tensor
from kiln.te.loops import (
    Assign,
    Barrier,
    Decl,
    For,
    If,
    Let,
    Store,
    accumulator_init,
    combine,
    combine_lanes,
    lane_loop,
    ravel,
    unravel,
)

#: most elements a row (reduction or output columns) may have for a row kernel (longer rows keep separate kernels)
MAX_ROW = 8192


@dataclass
class RowPlan:
    """How a row kernel covers its output.

    Attributes:
        rows: positions of the output axes the reductions depend on (one workgroup per combination).
        cols: positions of the other output axes (the row's elements, shared among the lanes).
        levels: the reductions, those nested in a reduction's body in an earlier level.
    """

    rows: list[int]
    cols: list[int]
    levels: list[list[Reduce]]


def _at_upper(d) -> int:
    return int(upper(d)) if is_symbolic(d) else int(d)


def analyse_rows(t: Tensor, max_row: int = MAX_ROW) -> RowPlan | str:
    """The :class:`RowPlan` of computed tensor ``t`` (producers inlined), or why it has none (a string).

    ``t`` qualifies when it has reductions, each depends (besides its own axes) only on output axes
    (the row axes), at least one output axis of more than one element depends on none of them (the
    columns), and neither the reductions nor the row have more than ``max_row`` elements (run-time
    dims at their upper bound).
    """
    found: dict[Reduce, None] = {}
    transform(t.body, lambda x: found.setdefault(x, None) if isinstance(x, Reduce) else None)
    if not found:
        return "no reductions"
    axes = set(t.axes)
    level: dict[Reduce, int] = {}

    def level_of(r: Reduce) -> int:
        if r not in level:
            inner: dict[Reduce, None] = {}
            transform(r.body, lambda x: inner.setdefault(x, None) if isinstance(x, Reduce) else None)
            level[r] = 1 + max((level_of(i) for i in inner), default=0)
        return level[r]

    row_vars: set[Var] = set()
    for r in found:
        own = set().union(*(free_vars(i) for i in _nested(r))) if _nested(r) else set()
        free = free_vars(r.body) - set(r.axes) - own
        if not free <= axes:
            return "a reduction depends on another reduction's axis"
        row_vars |= free
        size = 1
        for ax in r.axes:
            size *= _at_upper(ax.extent)
        if size > max_row:
            return f"a reduction of {size} elements (more than {max_row})"
        level_of(r)
    rows = [a for a, ax in enumerate(t.axes) if ax in row_vars]
    cols = [a for a, ax in enumerate(t.axes) if ax not in row_vars]
    ncols = 1
    for a in cols:
        ncols *= _at_upper(t.shape[a])
    if ncols < 2:
        return "no columns: a plain reduction"
    if ncols > max_row:
        return f"rows of {ncols} elements (more than {max_row})"
    depth = max(level.values())
    levels = [[r for r in found if level[r] == k] for k in range(1, depth + 1)]
    return RowPlan(rows, cols, levels)


def _nested(r: Reduce) -> list[Var]:
    """The axes of the reductions nested in ``r``'s body (bound there, not free)."""
    out: list[Var] = []

    def visit(x):
        if isinstance(x, Reduce) and x is not r:
            out.extend(x.axes)

    transform(r.body, visit)
    return out


def lower_rows(out: Tensor, plan: RowPlan, lanes: int, flat, cse, counter):
    """Statements of the row kernel of ``out`` (canonical, producers inlined) under ``plan``, ``lanes``
    invocations a workgroup (a power of two).

    ``flat(e, guarded)`` flattens an expression over buffer loads and ``cse(values, block)`` binds
    shared loads (both from :func:`kiln.te.lower.lower`). Returns ``(body, total rows, shared arrays)``.
    """

    lid, wid, lane, tile, gid = Var("lid"), Var("wid"), Var("lane"), Var("tile"), Var("gid")
    row_shape = [out.shape[a] for a in plan.rows]
    col_shape = [out.shape[a] for a in plan.cols]
    total = simplify(_prod(row_shape))
    # out-of-range workgroups (a dispatch wrapped into y) compute a clamped row and store nothing
    body: list = [Let(lane, lid), Let(tile, wid), Let(gid, call("min", tile, total - 1))]
    body += unravel(gid, [out.axes[a] for a in plan.rows], row_shape, total)
    accs: dict[Reduce, Var] = {}
    shared: dict[str, tuple[str, int]] = {}

    def known(e: Expr) -> Expr:
        return transform(e, lambda x: accs.get(x) if isinstance(x, Reduce) else None)

    for k, level in enumerate(plan.levels):
        if k:
            body.append(Barrier())  # every lane has read the previous level's sums from workgroup memory
        made = []
        for r in level:
            acc = Var(f"acc{next(counter)}", 0, r.dtype)
            body.append(Decl(acc, accumulator_init(r)))
            loop, inner = lane_loop(r.axes[0], lanes, lane, f"{r.axes[0].name}s{next(counter)}")
            body.append(loop)
            for ax in r.axes[1:]:
                nest = For(ax, ax.extent)
                inner.append(nest)
                inner = nest.body
            value = flat(combine(r.op, acc, known(r.body)), False)
            inner.append(Assign(acc, cse([value], inner)[0]))
            made.append((r, acc))
        got = combine_lanes([(acc, r.op) for r, acc in made], lanes, lanes, body)
        for name, (dtype, size) in got.items():
            if name in shared and shared[name][0] != dtype:
                raise ValueError("row kernel: reductions of different dtypes meet in workgroup memory")
            shared[name] = (dtype, max(size, shared.get(name, (dtype, 0))[1]))
        accs.update(made)
    ncols = simplify(_prod(col_shape))
    steps = ceil_div(ncols, lanes)
    c = Var(f"c{next(counter)}")
    loop = For(Var(f"cs{next(counter)}", steps), steps)
    body.append(loop)
    loop.body.append(Let(c, loop.var * lanes + lane))
    cond = binop("<", tile, total)
    if is_symbolic(steps) or steps * lanes != ncols:
        cond = cond & binop("<", c, ncols)
    store_block = If(cond)
    loop.body.append(store_block)
    store_block.body += unravel(c, [out.axes[a] for a in plan.cols], col_shape, ncols)
    value = cse([flat(known(out.body), False)], store_block.body)[0]
    store_block.body.append(Store("out", linear(ravel(list(out.axes), out.shape)), value))
    return body, total, shared


def _prod(dims):
    n = 1
    for d in dims:
        n = n * d
    return n
