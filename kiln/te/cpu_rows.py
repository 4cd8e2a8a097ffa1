"""Row kernels of the C targets (wasm, cpu): a tile a row, its reductions and then its elements in one call.

A fused LayerNormalization or Softmax (:func:`kiln.passes.fusion.fuse_rows`, a :class:`kiln.te.rows.RowPlan` without
stages or column reductions) is three kernels when each reduction is its own: each re-reads the whole tensor from
memory, and the Softmax computes every ``exp`` twice (once summed, once divided). As one kernel a call computes one
row (the tile) while it stays in the L1 cache:

1. the row reductions level by level (the max, then the sum of exponentials that reads it; the mean, then the
   variance), each over its axis in vectors of ``lanes`` elements (a ``For`` with ``lanes``: a ``simd_reduce`` loop,
   vectorised along the row by :func:`kiln.codegen.vectorize.vector_body`, sums, maxima and minima combined across
   the lanes after it) and a scalar tail;
2. the row's elements, in vectors along the row again, reading the reductions as scalars.

When the output's expression contains a reduction's body at the column (the Softmax's ``exp(x[c] - max)`` beside
``sum_k exp(x[k] - max)``), that reduction's loop also stores its terms into the output row (an *element stage*),
and the elements read them back instead of recomputing them: one ``exp`` an element. Terms divided by their sum are
multiplied by its reciprocal, computed once a row (as onnxruntime's MLAS softmax does; within an ulp of dividing,
for a sum that is not subnormal: a Softmax's is at least 1).
"""

from __future__ import annotations

from kiln.arith.expr import Bin, Call, Expr, Reduce, Var, const, linear, substitute, transform
from kiln.arith.symbolic import is_symbolic, simplify
from kiln.te.compute import Tensor
from kiln.te.loops import Assign, BufLoad, Decl, For, Let, Store, accumulator_init, combine, ravel, unravel
from kiln.te.rows import RowPlan

#: reductions a lane loop combines across its lanes after the loop (kiln.codegen.vectorize)
LANE_OPS = ("sum", "max", "min")


def cpu_row_plan(plan: RowPlan | str, t: Tensor) -> RowPlan | str:
    """``plan`` (:func:`kiln.te.rows.analyse_rows` of ``t``) when the C targets' row lowering takes it, else why not:
    no stages or column reductions (attention), one reduction axis each, and the row along the output's innermost
    axis (so that a row's elements and its reductions' terms lie contiguous in memory: vectors along it)."""
    if isinstance(plan, str):
        return plan
    if plan.stages or plan.columns or plan.hoisted:
        return "stages or column reductions (attention)"
    if [a for a in plan.cols if is_symbolic(t.shape[a]) or t.shape[a] != 1] != [len(t.shape) - 1]:
        return "the row is not the output's innermost axis"
    if any(len(r.axes) != 1 for level in plan.levels for r in level):
        return "a reduction over several axes"
    return plan


def _element_stage(out: Tensor, plan: RowPlan, known) -> tuple[Reduce, Expr] | None:
    """A reduction of the last level whose term at the row's column is part of the output's expression and calls a
    function (the Softmax's exponential), and that term over the column axis; None when none is."""
    col, width = out.axes[plan.cols[-1]], out.shape[plan.cols[-1]]
    whole = known(out.body)
    parts: set[Expr] = set()
    transform(whole, lambda x: parts.add(x) if not isinstance(x, (Var, BufLoad)) else None)
    for r in plan.levels[-1]:
        ax = r.axes[0]
        if r.dtype != out.dtype or out.dtype != "float32" or simplify(ax.extent - width) != 0:
            continue
        term = substitute(known(r.body), {ax: col})
        if term in parts and _calls(term):
            return r, term
    return None


def _calls(e: Expr) -> bool:
    """Whether ``e`` calls a function (worth storing rather than computing again: ``exp``)."""
    found: list[Call] = []
    transform(e, lambda x: found.append(x) if isinstance(x, Call) else None)
    return bool(found)


def _row_loops(ax: Var, ext, lanes: int, counter) -> list[tuple[list, list]]:
    """Loops binding ``ax`` over ``[0, ext)``: the vectors (``extent // lanes`` rounds of a lane loop), then the
    scalar tail, each as ``(statements, the block the body goes in)``; only the parts the extent has (a static one
    of fewer than ``lanes`` elements: the tail alone)."""
    n = next(counter)
    parts = []
    full = simplify(ext // lanes) if is_symbolic(ext) else ext // lanes
    if is_symbolic(ext) or full:
        outer = For(Var(f"{ax.name}o{n}", full), full)
        lane = For(Var(f"{ax.name}l{n}", lanes), lanes, lanes=lanes)
        outer.body.append(lane)
        lane.body.append(Let(ax, outer.var * lanes + lane.var))
        parts.append(([outer], lane.body))
    rest = simplify(ext % lanes) if is_symbolic(ext) else ext % lanes
    if is_symbolic(rest) or rest:
        tail = For(Var(f"{ax.name}t{n}", rest), rest)
        start = full * lanes
        tail.body.append(Let(ax, start + tail.var))
        parts.append(([tail], tail.body))
    return parts


def lower_rows_cpu(out: Tensor, plan: RowPlan, lanes: int, flat, cse, counter):
    """Statements of the C targets' row kernel of ``out`` (canonical, producers inlined; ``plan`` from
    :func:`cpu_row_plan`), a row a tile, vectors of ``lanes`` along it (see the module docstring).

    ``flat(e, guarded)`` flattens an expression over buffer loads and ``cse(values, block)`` binds shared loads (both
    from :func:`kiln.te.lower.lower`). Returns ``(body, total rows)``.
    """
    gid = Var("gid")
    row_shape = [out.shape[a] for a in plan.rows]
    total = simplify(_prod(row_shape))
    body: list = unravel(gid, [out.axes[a] for a in plan.rows], row_shape, total)
    body += [Let(out.axes[a], const(0, "int32")) for a in plan.cols[:-1]]  # (axes of one element)
    col = out.axes[plan.cols[-1]]
    address = linear(ravel(list(out.axes), out.shape))
    accs: dict[Reduce, Expr] = {}

    def known(e: Expr) -> Expr:
        return transform(e, lambda x: accs.get(x) if isinstance(x, Reduce) else None)

    stage = None
    for k, level in enumerate(plan.levels):
        if k == len(plan.levels) - 1:
            stage = _element_stage(out, plan, known)
        for r in level:
            ax = r.axes[0]
            if r.op in LANE_OPS and r.dtype == "float32":
                parts = _row_loops(ax, ax.extent, lanes, counter)
            else:  # (a product, integers: one scalar loop)
                loop = For(ax, ax.extent)
                parts = [([loop], loop.body)]
            made = []
            for stmts, inner in parts:
                acc = Var(f"acc{next(counter)}", 0, r.dtype)
                body.append(Decl(acc, accumulator_init(r)))
                body.extend(stmts)
                if stage is not None and stage[0] is r:  # the term stored into the row, summed from there
                    term = Var(f"e{next(counter)}", 0, r.dtype)
                    inner.append(Let(term, cse([flat(known(r.body), False)], inner)[0]))
                    inner.append(Store("out", substitute(address, {col: ax}), term))
                    inner.append(Assign(acc, combine(r.op, acc, term)))
                else:
                    inner.append(Assign(acc, cse([flat(combine(r.op, acc, known(r.body)), False)], inner)[0]))
                made.append(acc)
            value: Expr = made[0]
            for acc in made[1:]:  # the vectors' and the tail's
                value = combine(r.op, value, acc)
            if len(made) > 1:
                whole = Var(f"acc{next(counter)}", 0, r.dtype)
                body.append(Let(whole, value))
                value = whole
            accs[r] = value
    element = known(out.body)
    if stage is not None:
        reread = BufLoad("out", address, out.size, False, out.dtype)
        element = transform(element, lambda x: reread if x == stage[1] else None)
        total_sum = accs[stage[0]]
        if stage[0].op == "sum":  # terms divided by their sum: multiplied by its reciprocal, computed once a row
            recip = Var(f"rcp{next(counter)}", 0, out.dtype)
            body.append(Let(recip, 1.0 / total_sum))
            element = transform(element, lambda x: x.a * recip if isinstance(x, Bin) and x.op == "/" and
                                x.b == total_sum else None)
    for stmts, inner in _row_loops(col, out.shape[plan.cols[-1]], lanes, counter):
        body.extend(stmts)
        inner.append(Store("out", address, cse([flat(element, False)], inner)[0]))
    return body, total


def _prod(dims):
    p = const(1, "int32") if any(is_symbolic(d) for d in dims) else 1
    for d in dims:
        p = p * d
    return p
