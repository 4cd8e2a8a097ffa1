"""Lowering: a scheduled tensor expression to a small imperative kernel IR.

The kernel IR is target-neutral: a list of statements run by each invocation,
over flat buffer parameters. Each target's codegen renders it (WGSL in
:mod:`kiln.codegen.webgpu.wgsl`). Lowering

1. gives each invocation one flat output index ``gid`` and unravels it into the output axes,
2. hoists every :class:`~kiln.arith.expr.Reduce` into an accumulator and nested loops (equal
   reductions are computed once),
3. turns multi-dimensional loads into flat buffer loads, guarding the loads inside the
   taken branch of a :class:`~kiln.arith.expr.Select` (for example a padded convolution's
   border) so they never read out of bounds.
"""

from __future__ import annotations

import dataclasses
import itertools

from kiln.arith.expr import (
    Bin,
    Call,
    Cast,
    Const,
    Expr,
    Load,
    Reduce,
    Select,
    Var,
    binop,
    call,
    cast,
    const,
    free_vars,
    linear,
    reduces_in,
    select,
    substitute,
    transform,
)
from kiln.arith.symbolic import ceil_div, is_symbolic, simplify
from kiln.te.compute import Tensor, placeholders
from kiln.te.cpu_rows import cpu_row_plan, lower_rows_cpu
from kiln.te.loops import (
    Assign,
    Barrier,
    BufLoad,
    Decl,
    For,
    If,
    Let,
    LoweredKernel,
    Param,
    Store,
    accumulator_init,
    combine,
    combine_lanes,
    lane_loop,
    merge_arrays,
    prod,
    ravel,
    unravel,
)
from kiln.te.rows import analyse_rows, lower_rows
from kiln.te.schedule import Schedule
from kiln.te.tiles import analyse, lower_shared

#: independent accumulators of a ``simd_reduce`` loop (C targets) whose schedule unrolls: two lane loops a round, so a
#: sum is not one chain of dependent vector adds (Whisper's 80 MB output projection in Chromium's wasm: 4.1 ms a
#: decode step with one chain; a standalone kernel read its weights 12% faster with two)
SIMD_CHAINS = 2


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
    attrs = out.attrs
    if "store" in attrs:  # a store view's coordinates are expressions of the axes too
        shape, coords, keep = attrs["store"]
        attrs = {**attrs, "store": (shape, tuple(transform(e, rename) for e in coords), transform(keep, rename))}
    if "scan" in attrs:  # a scan's triangular reduction axes
        axis, state, tri = attrs["scan"]
        attrs = {**attrs, "scan": (axis, state, tuple(names[a] for a in tri if a in names))}
    return Tensor(out.name, out.shape, out.dtype, tuple(names[a] for a in out.axes), body, attrs)


def _cse_loads(values: list[Expr], block: list, counter) -> list[Expr]:
    """Bind each distinct :class:`BufLoad` of ``values`` to a ``let`` in ``block``; return ``values`` over them.

    Loads shared by several elements of a register tile (the input row a tile of output
    channels reads, the weight a tile of pixels reads) are then read once.
    """
    seen: dict[Expr, Var] = {}

    def visit(x):
        if isinstance(x, BufLoad):
            if x not in seen:
                v = Var(f"v{next(counter)}", 0, x.dtype)
                block.append(Let(v, x))
                seen[x] = v
            return seen[x]
        return None

    return [transform(v, visit) for v in values]


def flatten(e: Expr, guarded: bool, pname: dict[int, str]) -> Expr:
    """``e`` (no reductions) over flat buffer loads: each :class:`Load` of a placeholder becomes a
    :class:`BufLoad` of parameter ``pname[id(tensor)]``; loads inside the taken branch of a
    :class:`Select` (and all loads when ``guarded``) clamp their index into the buffer."""
    if isinstance(e, Load):
        idx = linear(ravel([flatten(i, guarded, pname) for i in e.indices], e.tensor.shape))
        size = e.tensor.size
        return BufLoad(pname[id(e.tensor)], idx, size, guarded and (is_symbolic(size) or size > 0), e.dtype)
    if isinstance(e, Bin):
        a, b = flatten(e.a, guarded, pname), flatten(e.b, guarded, pname)
        if e.op in ("<", "<=", ">", ">=", "==", "!=") and a.dtype == "int32":
            a, b = linear(a), linear(b)
        return binop(e.op, a, b)
    if isinstance(e, Call):
        return call(e.fn, *(flatten(a, guarded, pname) for a in e.args))
    if isinstance(e, Select):
        return select(flatten(e.cond, guarded, pname), flatten(e.t, True, pname), flatten(e.f, guarded, pname))
    if isinstance(e, Cast):
        return cast(flatten(e.x, guarded, pname), e.dtype)
    if isinstance(e, Reduce):
        raise TypeError("reductions are hoisted before flattening")
    return e


def lower(out: Tensor, schedule: Schedule | None = None, name: str | None = None) -> LoweredKernel:
    """Lower computed tensor ``out`` (producers already inlined) under ``schedule`` (default :class:`Schedule`).

    Each invocation computes a register tile: the product of the schedule's splits (one
    element when there are none). All reductions of a tile share one loop nest whose
    innermost ``schedule.unroll`` iterations are unrolled, and loads equal across the tile's
    elements or unrolled iterations are read once.
    """
    schedule = schedule or Schedule()
    out = canonical(out)
    # a scan (kiln.te.compute.scan): a line along ``axis`` per invocation, ``state`` read from ``out``, the reduction
    # axes ``tri`` looping only up to the current element
    scan = out.attrs.get("scan")
    ins = [t for t in placeholders(out) if scan is None or t is not scan[1]]
    if "store" in out.attrs:  # buffers a store view's coordinates read (a TensorScatter's write indices)
        _, coords, keep = out.attrs["store"]
        for e in (*coords, keep):
            ins += [t for t in placeholders(Tensor("view", (), e.dtype, (), e)) if all(t is not i for i in ins)]
    pname = {id(t): f"in{k}" for k, t in enumerate(ins)}
    if scan is not None:
        pname[id(scan[1])] = "out"
        schedule = Schedule(workgroup_size=schedule.workgroup_size, max_groups_x=schedule.max_groups_x,
                            unroll=schedule.unroll)
    params = [Param(pname[id(t)], t.dtype, t.size, "read") for t in ins]
    # a store view (``attrs["store"]``: the buffer's shape, each element's coordinates in it and whether to store
    # it, expressions of the axes): the kernel writes its elements into part of a larger buffer (an in-place
    # TensorScatter)
    view = out.attrs.get("store")
    params.append(Param("out", out.dtype, prod(view[0]) if view else out.size, "read_write"))
    counter = itertools.count()
    if view and (schedule.shared_k or schedule.rows or schedule.reduce_lanes > 1):
        schedule = dataclasses.replace(schedule, shared_k=0, prefetch=False, rows=False, reduce_lanes=1)
    if schedule.shared_k:
        found = analyse(out, schedule)
        if isinstance(found, str):  # not a contraction (or too large): lowered without shared tiles
            schedule = dataclasses.replace(schedule, shared_k=0, prefetch=False)
        else:
            body, total, shared, vectors = lower_shared(out, found, schedule, lambda e, g: flatten(e, g, pname),
                                                        lambda vals, block: _cse_loads(vals, block, counter), counter)
            if schedule.vector_width > 1 and not vectors:  # no operand tile read as vectors
                schedule = dataclasses.replace(schedule, vector_width=1)
            return LoweredKernel(name or out.name, params, ins, total, Var("gid"), body, schedule, shared, vectors)
    if schedule.rows and schedule.simd_reduce:  # (C targets) a row a tile, vectors along it: kiln.te.cpu_rows
        plan = cpu_row_plan(analyse_rows(out), out)
        if isinstance(plan, str):
            schedule = dataclasses.replace(schedule, rows=False)
        else:
            body, total = lower_rows_cpu(out, plan, schedule.simd_reduce, lambda e, g: flatten(e, g, pname),
                                         lambda vals, block: _cse_loads(vals, block, counter), counter)
            return LoweredKernel(name or out.name, params, ins, total, Var("gid"), body, schedule)
    if schedule.rows:
        plan = analyse_rows(out)
        if isinstance(plan, str):  # not a row kernel: lowered element by element
            schedule = dataclasses.replace(schedule, rows=False, reduce_lanes=1)
        else:
            body, total, shared = lower_rows(out, plan, schedule.reduce_lanes, lambda e, g: flatten(e, g, pname),
                                             lambda vals, block: _cse_loads(vals, block, counter), counter,
                                             schedule.workgroup_size)
            return LoweredKernel(name or out.name, params, ins, total, Var("gid"), body, schedule, shared)
    if schedule.vector_width > 1:  # vector width applies to shared operand tiles only (for now)
        schedule = dataclasses.replace(schedule, vector_width=1)
    # a split of a run-time extent is always guarded (correct for every value, e.g. seq=1 with tiles of 4)
    splits = {s.axis: s for s in schedule.splits
              if s.factor > 1 and (is_symbolic(out.shape[s.axis]) or out.shape[s.axis] > 1)}
    outer_shape = [ceil_div(d, splits[a].factor) if a in splits else d for a, d in enumerate(out.shape)]
    outer = [Var(f"{ax.name}o") if a in splits else ax for a, ax in enumerate(out.axes)]
    par = [a for a in range(len(out.shape)) if scan is None or a != scan[0]]  # axes spread over invocations
    total = simplify(prod([outer_shape[a] for a in par]))
    gid = Var("gid")
    lanes = schedule.reduce_lanes
    body: list = []
    if lanes > 1:
        # lanes of one tile are neighbouring invocations; out-of-range tiles compute a clamped
        # tile (every invocation must reach the barriers) and do not store
        lid, wid, lane, tile = Var("lid"), Var("wid"), Var("lane"), Var("tile")
        body += [Let(lane, lid % lanes), Let(tile, wid * (schedule.workgroup_size // lanes) + lid // lanes),
                 Let(gid, call("min", tile, total - 1))]
    body += unravel(gid, [outer[a] for a in par], [outer_shape[a] for a in par], total)
    kernel_body = body
    if scan is not None:  # the scan axis in order, each element stored before the next reads it
        loop = For(out.axes[scan[0]], out.shape[scan[0]])
        body.append(loop)
        body = loop.body
    split_accs: list[tuple[Var, str]] = []
    hoisted: dict[str, tuple[str, int]] = {}  # workgroup arrays of the reductions hoisted out of a split nest
    # nested reductions computed before a nest in the kernel's body, by their expression: a value read twice (the
    # maximum of a softmax's numerator and of its denominator in two sums) is reduced once
    top = body
    reduced: dict[Reduce, Var] = {}

    # the elements of the register tile: axis values, clamped values for loads, in-range condition
    elements = []
    split_axes = sorted(splits)
    for combo in itertools.product(*(range(splits[a].factor) for a in split_axes)):
        vals, clamped, cond = {}, {}, const(True, "bool")
        for a, j in zip(split_axes, combo):
            s, extent, n_outer = splits[a], out.shape[a], outer_shape[a]
            v, top = s.offset(outer[a], n_outer, j), s.offset(n_outer - 1, n_outer, j)
            vals[out.axes[a]] = v
            clamped[out.axes[a]] = v
            if is_symbolic(extent) or top >= extent:
                cond = cond & binop("<", v, extent)
                clamped[out.axes[a]] = call("min", v, extent - 1)
        elements.append((vals, clamped, cond))

    def flat(e: Expr, guarded: bool) -> Expr:
        return flatten(e, guarded, pname)

    def accumulate(r: Reduce, acc: Var, v: Expr) -> Expr:
        return flat(combine(r.op, acc, v), False)

    def hoist(e: Expr, block: list, memo: dict) -> Expr:
        """Emit statements computing every Reduce in ``e`` into ``block``; return ``e`` over accumulators."""
        if isinstance(e, Reduce):
            if e not in memo:
                memo[e] = reduction_nest([e], block)[e]
            return memo[e]
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

    def reduction_nest(group: list[Reduce], block: list, split: bool = False) -> dict:
        """One loop nest over the shared axes of ``group``, accumulating each; returns Reduce -> accumulator.

        With ``split`` the outermost axis is dealt round-robin to the tile's lanes (partial
        accumulators, combined later through workgroup memory).
        """
        # reductions nested in the bodies that do not depend on this nest's axes (RMSNorm's sum of squares in the
        # prologue of the matmul after it): computed once before the nest, not once per iteration
        pre = {}
        for n in dict.fromkeys(n for r in group for n in reduces_in(r.body, outermost=True)):
            if free_vars(n) & set(group[0].axes) or (scan is not None and free_vars(n) & set(scan[2])):
                continue
            if block is top and n in reduced:
                pre[n] = reduced[n]
                continue
            if split:  # dealt to the tile's lanes too, and combined at once
                before = len(split_accs)
                pre[n] = reduction_nest([n], block, split=True)[n]
                mine, split_accs[before:] = split_accs[before:], []
                merge_arrays(hoisted, combine_lanes(mine, lanes, schedule.workgroup_size, block))
                block.append(Barrier())  # every lane has its value before the array is used again
            else:
                pre[n] = reduction_nest([n], block)[n]
            if block is top:
                reduced[n] = pre[n]
        accs = {}
        for r in group:
            acc = Var(f"acc{next(counter)}", 0, r.dtype)
            block.append(Decl(acc, accumulator_init(r)))
            accs[r] = acc
        axes = group[0].axes
        inner = block
        simd = schedule.simd_reduce
        if simd and not split and scan is None and axes and not is_symbolic(axes[-1].extent) \
                and axes[-1].extent % simd == 0 and all(r.op == "sum" and r.dtype == "float32" for r in group):
            # (C targets) the innermost axis dealt to SIMD lanes: ax = outer * lanes + lane, the lane loop innermost;
            # with an unroll, SIMD_CHAINS lane loops a round into as many accumulators (independent add chains)
            ax = axes[-1]
            chains = SIMD_CHAINS if schedule.unroll >= SIMD_CHAINS and ax.extent % (SIMD_CHAINS * simd) == 0 else 1
            chain_accs = [accs] + [{} for _ in range(chains - 1)]
            for extra in chain_accs[1:]:
                for r in group:
                    extra[r] = Var(f"acc{next(counter)}", 0, r.dtype)
                    block.append(Decl(extra[r], accumulator_init(r)))
            outer_ax, lane_ax = Var(f"{ax.name}o", ax.extent // (simd * chains)), Var(f"{ax.name}l", simd)
            for loop_ax in (*axes[:-1], outer_ax):
                loop = For(loop_ax, loop_ax.extent)
                inner.append(loop)
                inner = loop.body
            for c, mine in enumerate(chain_accs):
                lanes_loop = For(lane_ax, simd, lanes=simd)
                inner.append(lanes_loop)
                fixed = {ax: outer_ax * (simd * chains) + c * simd + lane_ax}
                updates = [(mine[r], accumulate(r, mine[r], hoist(substitute(r.body, fixed), lanes_loop.body,
                                                                   dict(pre)))) for r in group]
                values = _cse_loads([u for _, u in updates], lanes_loop.body, counter)
                lanes_loop.body.extend(Assign(acc, v) for (acc, _), v in zip(updates, values))
            if chains == 1:
                return accs
            totals = {}
            for r in group:
                totals[r] = Var(f"acc{next(counter)}", 0, r.dtype)
                total: Expr = accs[r]
                for extra in chain_accs[1:]:
                    total = total + extra[r]
                block.append(Let(totals[r], total))
            return totals
        if split:
            loop, body = lane_loop(axes[0], lanes, lane, f"{axes[0].name}s")
            inner.append(loop)
            inner = body
            axes = axes[1:]
            split_accs.extend((accs[r], r.op) for r in group)
        n_unrolled, product = 0, 1
        tri = scan[2] if scan is not None else ()
        for ax in reversed(axes):
            if is_symbolic(ax.extent) or product * ax.extent > schedule.unroll or ax in tri:
                break
            product *= ax.extent
            n_unrolled += 1
        # the innermost axis too long to unroll whole: unroll it partially by its largest divisor
        # within the budget (``ax = outer * f + c`` for constant ``c``)
        partial = None
        if n_unrolled == 0 and axes and schedule.unroll > 1 and not is_symbolic(axes[-1].extent) and \
                axes[-1] not in tri:
            ax = axes[-1]
            f = max((d for d in range(2, schedule.unroll + 1) if ax.extent % d == 0), default=0)
            if f:
                partial = (ax, Var(f"{ax.name}u", ax.extent // f), f)
        looped = list(axes[:len(axes) - n_unrolled])
        if partial:
            looped[-1] = partial[1]
        for ax in looped:
            loop = For(ax, out.axes[scan[0]] if ax in tri else ax.extent)
            inner.append(loop)
            inner = loop.body
        unrolled = axes[len(axes) - n_unrolled:]
        combos = [{ax: const(c, "int32") for ax, c in zip(unrolled, combo)}
                  for combo in itertools.product(*(range(ax.extent) for ax in unrolled))]
        if partial:
            ax, outer_ax, f = partial
            combos = [{ax: outer_ax * f + c} for c in range(f)]
        updates: list[tuple[Var, Expr]] = []
        for fixed in combos:
            for r in group:
                v = hoist(substitute(r.body, fixed) if fixed else r.body, inner, dict(pre))
                updates.append((accs[r], accumulate(r, accs[r], v)))
        values = _cse_loads([u for _, u in updates], inner, counter)
        inner.extend(Assign(acc, v) for (acc, _), v in zip(updates, values))
        return accs

    bodies = [substitute(out.body, clamped) if clamped else out.body for _, clamped, _ in elements]
    found = dict.fromkeys(r for b in bodies for r in reduces_in(b, outermost=True))
    by_axes: dict[tuple, list[Reduce]] = {}
    for r in found:
        by_axes.setdefault(r.axes, []).append(r)
    accs: dict = {}
    for group in by_axes.values():
        accs.update(reduction_nest(group, body, split=lanes > 1))
    shared: dict[str, tuple[str, int]] = dict(hoisted)
    if split_accs:
        merge_arrays(shared, combine_lanes(split_accs, lanes, schedule.workgroup_size, body))
        tile_ok = binop("==", lane, 0) & binop("<", tile, total)
        elements = [(vals, clamped, tile_ok & cond) for vals, clamped, cond in elements]
    results = [flat(transform(b, lambda x: accs.get(x) if isinstance(x, Reduce) else None), False) for b in bodies]
    results = _cse_loads(results, body, counter)
    for (vals, _, cond), value in zip(elements, results):
        if view:
            index = linear(ravel([flat(substitute(e, vals) if vals else e, True) for e in view[1]], view[0]))
            cond = cond & flat(substitute(view[2], vals) if vals else view[2], True)
        else:
            index = linear(ravel([vals.get(ax, ax) for ax in out.axes], out.shape))
        store = Store("out", index, value)
        body.append(If(cond, [store]) if not (isinstance(cond, Const) and cond.value) else store)
    return LoweredKernel(name or out.name, params, ins, total, gid, kernel_body, schedule, shared)


__all__ = ["canonical", "flatten", "lower"]
