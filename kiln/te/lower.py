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

import dataclasses
import itertools
from dataclasses import dataclass, field

from kiln.te.compute import Tensor, placeholders
from kiln.te.expr import (
    FLOATS,
    Bin,
    Call,
    Cast,
    Const,
    Expr,
    Load,
    Reduce,
    Select,
    SizeVar,
    Var,
    binop,
    call,
    cast,
    const,
    highest,
    linear,
    lowest,
    select,
    substitute,
    transform,
)
from kiln.te.schedule import Schedule
from kiln.te.symbolic import ceil_div, is_symbolic, simplify


@dataclass(frozen=True, eq=True)
class BufLoad(Expr):
    """Element ``index`` of flat buffer parameter ``buf``; ``guard`` clamps the index into ``[0, size)``."""

    buf: str
    index: Expr
    size: int
    guard: bool
    dtype: str


@dataclass(frozen=True, eq=True)
class VecLoad(Expr):
    """Vector ``index`` (``width`` consecutive elements from ``index * width``) of workgroup array
    ``buf``, declared as an array of ``width``-vectors (see ``LoweredKernel.vectors``); ``dtype`` is the element type."""

    buf: str
    index: Expr
    width: int
    dtype: str


@dataclass(frozen=True, eq=True)
class Lane(Expr):
    """Component ``lane`` of vector expression ``x`` (a :class:`VecLoad` or a variable bound to one)."""

    x: Expr
    lane: int
    dtype: str


@dataclass(frozen=True, eq=True)
class Vec(Expr):
    """A vector of ``items`` (each of element type ``dtype``), stored whole by a :class:`Store` to an
    array of vectors (``LoweredKernel.vectors``), whose index then counts vectors."""

    items: tuple
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
class Barrier:
    """``workgroupBarrier()``: every invocation of the workgroup reaches it before any passes
    (WGSL §17.11); only emitted at the top level of a kernel body (uniform control flow)."""


@dataclass
class If:
    """``if (cond) { body }``."""

    cond: Expr
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
        total: register tiles of the output (each one invocation, or ``reduce_lanes`` of them); under
            shared operand tiles (``schedule.shared_k``), the invocations of the dispatch.
        gid: the variable holding the invocation's flat tile index.
        body: statements run when ``gid < total`` (every invocation when :attr:`cooperative`: then
            the body binds ``gid`` itself from the builtins ``lid``, the local invocation index,
            and ``wid``, the flat workgroup index, and guards its stores).
        schedule: the schedule it was lowered with.
        shared: workgroup-memory arrays, name -> (dtype, elements).
        vectors: workgroup arrays declared as arrays of vectors, name -> width (``vector_width``):
            read whole with :class:`VecLoad`, stored element by element (``buf[i / w][i % w]``) or
            whole (a :class:`Vec` value); a storage buffer among them is bound as an array of vectors.
    """

    name: str
    params: list[Param]
    inputs: list[Tensor]
    total: int
    gid: Var
    body: list
    schedule: Schedule
    shared: dict[str, tuple[str, int]] = field(default_factory=dict)
    vectors: dict[str, int] = field(default_factory=dict)

    @property
    def lanes(self) -> int:
        """Invocations cooperating on one tile's reductions."""
        return self.schedule.reduce_lanes

    @property
    def cooperative(self) -> bool:
        """Whether the invocations of a workgroup cooperate through workgroup memory and barriers
        (reduce lanes or shared operand tiles): none may return early."""
        return self.lanes > 1 or bool(self.shared)

    @property
    def dispatch(self) -> tuple[int, int, int]:
        """Workgroup counts of the dispatch (for run-time dims: see :attr:`groups`)."""
        return self.schedule.dispatch(self.total * self.lanes)

    @property
    def groups(self) -> int | Expr:
        """Workgroups of the dispatch before wrapping into y: an int, or a size expression of run-time dims."""
        return ceil_div(simplify(self.total * self.lanes), self.schedule.workgroup_size)

    @property
    def size_vars(self) -> list:
        """The run-time dims (:class:`~kiln.te.expr.SizeVar`) the kernel reads, by uniform index."""
        found: dict = {}
        seen: set[int] = set()

        def walk(x):
            if isinstance(x, (list, tuple)):
                for a in x:
                    walk(a)
            elif isinstance(x, SizeVar):
                found[x.name] = x
            elif hasattr(x, "__dataclass_fields__") and not isinstance(x, (Var, Const, Tensor)):
                if id(x) in seen:
                    return
                seen.add(id(x))
                for f in x.__dataclass_fields__:
                    walk(getattr(x, f))

        walk(self.body)
        walk(self.total)
        return sorted(found.values(), key=lambda s: s.index)


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


def _unravel(flat_index: Expr, axes, shape, total: int) -> list:
    """``Let`` statements binding each of ``axes`` to its coordinate in flat ``flat_index`` over ``shape``
    (dims may be size expressions of run-time dims)."""
    out = []
    for k, (ax, d) in enumerate(zip(axes, shape)):
        stride = simplify(_prod(shape[k + 1:]))
        if not is_symbolic(d) and d == 1:
            out.append(Let(ax, const(0, "int32")))
            continue
        v = flat_index // stride if not (not is_symbolic(stride) and stride == 1) else flat_index
        if simplify(stride * d) != simplify(total):
            v = v % d
        out.append(Let(ax, v))
    return out


def _prod(dims):
    n = 1
    for d in dims:
        n = n * d
    return n


def _reduces(e: Expr, found: dict) -> None:
    """Collect the outermost :class:`Reduce` nodes of ``e`` into ``found`` (ordered, deduplicated)."""
    def visit(x):
        if isinstance(x, Reduce):
            found.setdefault(x, None)
            return x
        return None

    transform(e, visit)


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
        idx = linear(_ravel([flatten(i, guarded, pname) for i in e.indices], e.tensor.shape))
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
    ins = placeholders(out)
    pname = {id(t): f"in{k}" for k, t in enumerate(ins)}
    params = [Param(pname[id(t)], t.dtype, t.size, "read") for t in ins]
    params.append(Param("out", out.dtype, out.size, "read_write"))
    counter = itertools.count()
    if schedule.shared_k:
        from kiln.te.tiles import analyse, lower_shared

        found = analyse(out, schedule)
        if isinstance(found, str):  # not a contraction (or too large): lowered without shared tiles
            schedule = dataclasses.replace(schedule, shared_k=0, prefetch=False)
        else:
            body, total, shared, vectors = lower_shared(out, found, schedule, lambda e, g: flatten(e, g, pname),
                                                        lambda vals, block: _cse_loads(vals, block, counter), counter)
            if schedule.vector_width > 1 and not vectors:  # no operand tile read as vectors
                schedule = dataclasses.replace(schedule, vector_width=1)
            return LoweredKernel(name or out.name, params, ins, total, Var("gid"), body, schedule, shared, vectors)
    if schedule.rows:
        from kiln.te.rows import analyse_rows, lower_rows

        plan = analyse_rows(out)
        if isinstance(plan, str):  # not a row kernel: lowered element by element
            schedule = dataclasses.replace(schedule, rows=False, reduce_lanes=1)
        else:
            body, total, shared = lower_rows(out, plan, schedule.reduce_lanes, lambda e, g: flatten(e, g, pname),
                                             lambda vals, block: _cse_loads(vals, block, counter), counter)
            return LoweredKernel(name or out.name, params, ins, total, Var("gid"), body, schedule, shared)
    if schedule.vector_width > 1:  # vector width applies to shared operand tiles only (for now)
        schedule = dataclasses.replace(schedule, vector_width=1)
    # a split of a run-time extent is always guarded (correct for every value, e.g. seq=1 with tiles of 4)
    splits = {s.axis: s for s in schedule.splits
              if s.factor > 1 and (is_symbolic(out.shape[s.axis]) or out.shape[s.axis] > 1)}
    outer_shape = [ceil_div(d, splits[a].factor) if a in splits else d for a, d in enumerate(out.shape)]
    outer = [Var(f"{ax.name}o") if a in splits else ax for a, ax in enumerate(out.axes)]
    total = simplify(_prod(outer_shape))
    gid = Var("gid")
    lanes = schedule.reduce_lanes
    body: list = []
    if lanes > 1:
        # lanes of one tile are neighbouring invocations; out-of-range tiles compute a clamped
        # tile (every invocation must reach the barriers) and do not store
        lid, wid, lane, tile = Var("lid"), Var("wid"), Var("lane"), Var("tile")
        body += [Let(lane, lid % lanes), Let(tile, wid * (schedule.workgroup_size // lanes) + lid // lanes),
                 Let(gid, call("min", tile, total - 1))]
    body += _unravel(gid, outer, outer_shape, total)
    split_accs: list[tuple[Var, str]] = []

    # the elements of the register tile: axis values, clamped values for loads, in-range condition
    elements = []
    split_axes = sorted(splits)
    for combo in itertools.product(*(range(splits[a].factor) for a in split_axes)):
        vals, clamped, cond = {}, {}, const(True, "bool")
        for a, j in zip(split_axes, combo):
            s, extent, n_outer = splits[a], out.shape[a], outer_shape[a]
            if s.contiguous:
                v, top = outer[a] * s.factor + j, (n_outer - 1) * s.factor + j
            else:
                v, top = outer[a] + j * n_outer, n_outer - 1 + j * n_outer
            vals[out.axes[a]] = v
            clamped[out.axes[a]] = v
            if is_symbolic(extent) or top >= extent:
                cond = cond & binop("<", v, extent)
                clamped[out.axes[a]] = call("min", v, extent - 1)
        elements.append((vals, clamped, cond))

    def flat(e: Expr, guarded: bool) -> Expr:
        return flatten(e, guarded, pname)

    def accumulate(r: Reduce, acc: Var, v: Expr) -> Expr:
        return flat(_combine(r.op, acc, v), False)

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
        accs = {}
        for r in group:
            acc = Var(f"acc{next(counter)}", 0, r.dtype)
            block.append(Decl(acc, accumulator_init(r)))
            accs[r] = acc
        axes = group[0].axes
        inner = block
        if split:
            loop, body = lane_loop(axes[0], lanes, lane, f"{axes[0].name}s")
            inner.append(loop)
            inner = body
            axes = axes[1:]
            split_accs.extend((accs[r], r.op) for r in group)
        n_unrolled, product = 0, 1
        for ax in reversed(axes):
            if is_symbolic(ax.extent) or product * ax.extent > schedule.unroll:
                break
            product *= ax.extent
            n_unrolled += 1
        # the innermost axis too long to unroll whole: unroll it partially by its largest divisor
        # within the budget (``ax = outer * f + c`` for constant ``c``)
        partial = None
        if n_unrolled == 0 and axes and schedule.unroll > 1 and not is_symbolic(axes[-1].extent):
            ax = axes[-1]
            f = max((d for d in range(2, schedule.unroll + 1) if ax.extent % d == 0), default=0)
            if f:
                partial = (ax, Var(f"{ax.name}u", ax.extent // f), f)
        looped = list(axes[:len(axes) - n_unrolled])
        if partial:
            looped[-1] = partial[1]
        for ax in looped:
            loop = For(ax, ax.extent)
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
                v = hoist(substitute(r.body, fixed) if fixed else r.body, inner, {})
                updates.append((accs[r], accumulate(r, accs[r], v)))
        values = _cse_loads([u for _, u in updates], inner, counter)
        inner.extend(Assign(acc, v) for (acc, _), v in zip(updates, values))
        return accs

    bodies = [substitute(out.body, clamped) if clamped else out.body for _, clamped, _ in elements]
    found: dict = {}
    for b in bodies:
        _reduces(b, found)
    by_axes: dict[tuple, list[Reduce]] = {}
    for r in found:
        by_axes.setdefault(r.axes, []).append(r)
    accs: dict = {}
    for group in by_axes.values():
        accs.update(reduction_nest(group, body, split=lanes > 1))
    shared: dict[str, tuple[str, int]] = {}
    if split_accs:
        shared = _combine_lanes(split_accs, lanes, schedule.workgroup_size, body)
        tile_ok = binop("==", lane, 0) & binop("<", tile, total)
        elements = [(vals, clamped, tile_ok & cond) for vals, clamped, cond in elements]
    results = [flat(transform(b, lambda x: accs.get(x) if isinstance(x, Reduce) else None), False) for b in bodies]
    results = _cse_loads(results, body, counter)
    for (vals, _, cond), value in zip(elements, results):
        index = linear(_ravel([vals.get(ax, ax) for ax in out.axes], out.shape))
        store = Store("out", index, value)
        body.append(If(cond, [store]) if not (isinstance(cond, Const) and cond.value) else store)
    return LoweredKernel(name or out.name, params, ins, total, gid, body, schedule, shared)


def accumulator_init(r: Reduce) -> Expr:
    """The identity of reduction ``r``'s combiner: its accumulator's initial value."""
    return const({"sum": 0.0 if r.dtype in FLOATS else 0, "max": lowest(r.dtype), "min": highest(r.dtype),
                  "prod": 1}[r.op], r.dtype)


def lane_loop(ax0: Var, lanes: int, lane: Expr, name: str) -> tuple[For, list]:
    """A loop over every ``lanes``-th value of reduction axis ``ax0`` from ``lane`` on (binding ``ax0``), the last,
    partial round guarded; returns the loop and the block its body statements go into."""
    steps = ceil_div(ax0.extent, lanes)
    loop = For(Var(name, steps), steps)
    loop.body.append(Let(ax0, loop.var * lanes + lane))
    inner = loop.body
    if is_symbolic(steps) or steps * lanes != ax0.extent:
        guard = If(binop("<", ax0, ax0.extent))
        inner.append(guard)
        inner = guard.body
    return loop, inner


def _combine(op: str, acc: Expr, v: Expr) -> Expr:
    """One step of reduction ``op`` (``sum``, ``prod``, ``max``, ``min``)."""
    if op == "sum":
        return acc + v
    if op == "prod":
        return acc * v
    return call(op, acc, v)


def _combine_lanes(accs: list[tuple[Var, str]], lanes: int, width: int, body: list) -> dict[str, tuple[str, int]]:
    """Tree-combine each lane's partial accumulators through workgroup memory (log2(lanes) steps).

    Accumulator ``a`` of invocation ``lid`` lives at ``red[a * width + lid]``, so the lanes of
    a step touch consecutive words. Afterwards every lane holds the tile's full value.
    Returns the workgroup arrays used.
    """
    lid, lane = Var("lid"), Var("lane")
    dtypes = {acc.dtype for acc, _ in accs}
    # one workgroup array: f16 and f32 accumulators (fp16 compute) meet in f32
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    size = len(accs) * width

    def slot(a: int, offset: int = 0) -> Expr:
        return linear(lid + (a * width + offset))

    for a, (acc, _) in enumerate(accs):
        body.append(Store("red", slot(a), cast(acc, dtype)))
    stride = lanes // 2
    while stride >= 1:
        body.append(Barrier())
        step = If(binop("<", lane, stride))
        for a, (_, op) in enumerate(accs):
            x = BufLoad("red", slot(a), size, False, dtype)
            y = BufLoad("red", slot(a, stride), size, False, dtype)
            step.body.append(Store("red", slot(a), _combine(op, x, y)))
        body.append(step)
        stride //= 2
    body.append(Barrier())
    for a, (acc, _) in enumerate(accs):
        body.append(Assign(acc, cast(BufLoad("red", linear(lid - lane + a * width), size, False, dtype), acc.dtype)))
    return {"red": (dtype, size)}


__all__ = ["Assign", "Barrier", "BufLoad", "Decl", "For", "If", "Lane", "Let", "LoweredKernel", "Param", "Store", "Vec", "VecLoad",
           "canonical", "flatten", "lower"]
