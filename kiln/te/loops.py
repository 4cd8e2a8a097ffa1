"""The loop IR: the small imperative kernel IR that lowering produces and every target renders.

A :class:`LoweredKernel` is a list of statements run by each invocation over flat buffer parameters
(:class:`Param`): ``let``/mutable locals, counted loops, guarded blocks, workgroup barriers and stores,
with expressions of :mod:`kiln.arith.expr` plus the flat loads of this module (:class:`BufLoad`,
:class:`VecLoad`). :mod:`kiln.te.lower` builds it; the renderers in ``kiln.codegen`` (WGSL, GLSL, C)
read it. The helpers at the end build statement patterns shared by the lowerings (:mod:`kiln.te.lower`,
row kernels :mod:`kiln.te.rows`, shared tiles :mod:`kiln.te.tiles`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kiln.arith.expr import (
    FLOATS,
    Const,
    Expr,
    Reduce,
    SizeVar,
    Var,
    binop,
    call,
    cast,
    const,
    free_vars,
    highest,
    linear,
    lowest,
    select,
    substitute,
    transform,
)
from kiln.arith.symbolic import ceil_div, is_symbolic, simplify
from kiln.errors import KilnError
from kiln.te.compute import Tensor

if TYPE_CHECKING:
    from kiln.te.schedule import Schedule


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
    """``for var in [0, extent)``. With ``lanes`` (the C targets' ``simd_reduce`` schedules) the iterations may run
    at once as the ``lanes`` lanes of one vector (``extent == lanes``; the body only accumulates sums); scalar
    renderers run it as a loop."""

    var: Var
    extent: int
    body: list = field(default_factory=list)
    lanes: int = 0


@dataclass
class Barrier:
    """``workgroupBarrier()``: every invocation of the workgroup reaches it before any passes
    (WGSL §17.11); only emitted at the top level of a kernel body (uniform control flow)."""


@dataclass
class Subgroups:
    """Statements in two forms that leave the same values in the same variables: ``plain`` (workgroup memory and
    barriers; every target renders it) and ``subgroup`` (WGSL's subgroup builtins, WebGPU feature ``subgroups``;
    WGSL spec §17.12), which a WGSL renderer may pick instead (:func:`kiln.codegen.webgpu.wgsl.render`). The
    ``subgroup`` form reads :data:`SUBGROUP_SIZE` and assumes a workgroup's invocations fill subgroups in
    ``local_invocation_index`` order (invocation ``i`` is lane ``i % size`` of subgroup ``i / size``), which a
    runtime checks on its device before it runs such a kernel (``kiln.runtime.subgroups``)."""

    plain: list = field(default_factory=list)
    subgroup: list = field(default_factory=list)


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
        """The run-time dims (:class:`~kiln.arith.expr.SizeVar`) the kernel reads, by uniform index."""
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


def loop_iterations(body: list, outer: int | Expr = 1, around: dict | None = None,
                    subgroups: bool = False) -> int | Expr:
    """Loop iterations one invocation runs in all, every loop of ``body`` counted with the trip counts of the loops
    around it (loops under an ``If`` are counted as taken); an int, or a size expression of run-time dims. Of
    :class:`Subgroups` statements the plain form counts, or with ``subgroups`` the subgroup form.

    A triangular loop (its trip count the variable of a loop around it, as a scan's, :mod:`kiln.te.lower`) counts
    exactly; any other trip count naming a loop or axis variable counts with the variable at its loop's trip count or
    its axis's extent (an upper bound for trip counts that grow with the variable, as the lowerings make them); a loop
    of one trip is no loop (not counted).

    Raises:
        KilnError: a trip count over a variable of no known bound.
    Mesa's llvmpipe (lavapipe, the Vulkan driver of machines without a GPU) ends a shader invocation silently after
    65535 loop iterations in all (``LP_MAX_TGSI_LOOP_ITERATIONS``, one counter shared by every loop of the shader);
    the package records this count (``targets.webgpu.kernels[].loop_iterations``) so a runtime there refuses what
    would come back wrong (docs/reliability.md).
    """
    around = around or {}
    total: int | Expr = 0
    for s in body:
        if isinstance(s, For):
            e = s.extent
            if isinstance(e, Var) and e in around:  # 0, 1, ..., E - 1 over the loop of variable e
                e = around[e]  # (the most trips, for loops inside it)
                n = simplify(outer * (e - 1) // 2)
            else:
                if isinstance(e, Expr):
                    e = substitute(e, {v: _bound(v, around) for v in free_vars(e)})
                n = simplify(outer * e)
            # (a loop of one trip is no loop: the shader compilers remove it)
            looped = n if is_symbolic(e) or e != 1 else 0
            total = total + looped + loop_iterations(s.body, n, {**around, s.var: e}, subgroups)
        elif isinstance(s, If):
            total = total + loop_iterations(s.body, outer, around, subgroups)
        elif isinstance(s, Subgroups):
            total = total + loop_iterations(s.subgroup if subgroups else s.plain, outer, around, subgroups)
    return simplify(total) if is_symbolic(total) else total


def _bound(v: Var, around: dict) -> int | Expr:
    """The most trips a trip count's variable ``v`` allows: an enclosing loop's trip count, or an axis's extent.

    Raises:
        KilnError: neither is known (a trip count this count cannot bound).
    """
    if v in around:
        return around[v]
    if isinstance(v.extent, Expr) or v.extent:
        return v.extent
    raise KilnError(f"cannot bound the loop iterations of a trip count over {v.name} (no extent known)")


def ravel(indices, shape) -> Expr:
    flat: Expr = const(0, "int32")
    for i, d in zip(indices, shape):
        flat = flat * d + i
    return flat


def unravel(flat_index: Expr, axes, shape, total: int) -> list:
    """``Let`` statements binding each of ``axes`` to its coordinate in flat ``flat_index`` over ``shape``
    (dims may be size expressions of run-time dims)."""
    out = []
    for k, (ax, d) in enumerate(zip(axes, shape)):
        stride = simplify(prod(shape[k + 1:]))
        if not is_symbolic(d) and d == 1:
            out.append(Let(ax, const(0, "int32")))
            continue
        v = flat_index // stride if not (not is_symbolic(stride) and stride == 1) else flat_index
        if simplify(stride * d) != simplify(total):
            v = v % d
        out.append(Let(ax, v))
    return out


def prod(dims):
    n = 1
    for d in dims:
        n = n * d
    return n


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


def combine(op: str, acc: Expr, v: Expr) -> Expr:
    """One step of reduction ``op`` (``sum``, ``prod``, ``max``, ``min``)."""
    if op == "sum":
        return acc + v
    if op == "prod":
        return acc * v
    return call(op, acc, v)


#: values a lane combines in one round of :func:`combine_lanes` (a power of two): 256 lanes take 3 rounds of barriers
#: (256 -> 32 -> 4 -> 1) where pairs took 8
COMBINE_RADIX = 8


def combine_lanes(accs: list[tuple[Var, str]], lanes: int, width: int, body: list) -> dict[str, tuple[str, int]]:
    """Combine each lane's partial accumulators over its group of ``lanes`` neighbouring lanes (``lane`` its index
    there, ``lid`` in the workgroup); afterwards every lane holds its group's full value. Returns the workgroup
    arrays used.

    Plain form (every target): a tree through workgroup memory; each round the first ``n / r`` of ``n`` lanes
    combine ``r`` (up to :data:`COMBINE_RADIX`) values ``n / r`` apart, so ``log_r(lanes)`` rounds, each after a
    barrier (a lane reads only slots no lane writes in that round). Accumulator ``a`` of invocation ``lid`` lives at
    ``red[a * width + lid]``, so the lanes of a step touch consecutive words.

    Where ``lanes`` is a power of two, also a :class:`Subgroups` form (:func:`_subgroup_combine`): a butterfly of
    ``subgroupShuffleXor`` inside each subgroup, then, for groups wider than a subgroup, one barrier and a sum of the
    group's subgroups' values.
    """
    lid, lane = Var("lid"), Var("lane")
    dtypes = {acc.dtype for acc, _ in accs}
    # one workgroup array: f16 and f32 accumulators (fp16 compute) meet in f32
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    size = len(accs) * width
    plain: list = []

    def slot(a: int, offset: int = 0) -> Expr:
        return linear(lid + (a * width + offset))

    for a, (acc, _) in enumerate(accs):
        plain.append(Store("red", slot(a), cast(acc, dtype)))
    count = lanes
    while count > 1:  # each round, the first count / r lanes combine r values each
        r = min(COMBINE_RADIX, count)
        count //= r
        plain.append(Barrier())
        step = If(binop("<", lane, count))
        for a, (_, op) in enumerate(accs):
            x = BufLoad("red", slot(a), size, False, dtype)
            for j in range(1, r):
                x = combine(op, x, BufLoad("red", slot(a, j * count), size, False, dtype))
            step.body.append(Store("red", slot(a), x))
        plain.append(step)
    plain.append(Barrier())
    for a, (acc, _) in enumerate(accs):
        plain.append(Assign(acc, cast(BufLoad("red", linear(lid - lane + a * width), size, False, dtype), acc.dtype)))
    if lanes < 2 or lanes & (lanes - 1):
        body += plain
    else:
        body.append(Subgroups(plain, _subgroup_combine(accs, lanes, width, dtype, size)))
    return {"red": (dtype, size)}


#: the subgroup size, an ``i32`` the WGSL renderer binds from ``@builtin(subgroup_size)`` (WGSL §13.3.1.1)
SUBGROUP_SIZE = Var("sg_size")
#: WebGPU's smallest and largest subgroup sizes (``subgroupMinSize`` is at least 4, ``subgroupMaxSize`` at most
#: 128; a shuffle's constant mask must be below 128)
MIN_SUBGROUP, MAX_SUBGROUP = 4, 128


def _subgroup_combine(accs: list[tuple[Var, str]], lanes: int, width: int, dtype: str, size: int) -> list:
    """The :class:`Subgroups` form of :func:`combine_lanes` (``lanes`` a power of two; subgroup sizes are powers of
    two from 4 to 128): each lane combines its value with lane ``lid ^ o``'s for ``o = min(lanes, 128) / 2, ..., 1``
    where ``o`` is below the subgroup size (``subgroupShuffleXor``; the partner is in the same group and subgroup), so
    every lane then holds its part of the group: the whole group where ``lanes`` fits a subgroup. A wider group
    (``lanes / sg_size`` subgroups) has each subgroup's first lane store its value at ``red[a * width + lid /
    sg_size]``; after one barrier every lane combines its group's values there. Shuffles run where every invocation
    does (no branch around them; WGSL's subgroup uniformity)."""
    lid, lane, sg = Var("lid"), Var("lane"), SUBGROUP_SIZE
    out: list = []
    o = min(lanes, MAX_SUBGROUP) // 2
    while o >= 1:
        for acc, op in accs:
            x = cast(acc, "float32") if acc.dtype == "float16" else acc  # (f16 shuffles need another feature)
            other = call("subgroup_shuffle_xor", x, const(o, "int32"))
            mixed = combine(op, acc, cast(other, acc.dtype) if acc.dtype == "float16" else other)
            out.append(Assign(acc, mixed if o < MIN_SUBGROUP else select(binop("<", const(o, "int32"), sg), mixed, acc)))
        o //= 2
    if lanes <= MIN_SUBGROUP:
        return out
    out.append(If(binop("==", lid % sg, 0),
                  [Store("red", linear(lid // sg + a * width), cast(acc, dtype)) for a, (acc, _) in enumerate(accs)]))
    out.append(Barrier())
    parts = Var("sg_parts", lanes // MIN_SUBGROUP)  # subgroups a group spans (its extent: the most there may be)
    first = Var("sg_first")
    wide = If(binop(">", binop("//", const(lanes, "int32"), sg), 1))  # (its lets are local to it)
    wide.body += [Let(parts, binop("//", const(lanes, "int32"), sg)), Let(first, (lid - lane) // sg)]
    j = Var("sg_j")
    gather = For(j, parts - 1)
    for a, (acc, op) in enumerate(accs):
        wide.body.append(Assign(acc, cast(BufLoad("red", linear(first + a * width), size, False, dtype), acc.dtype)))
        gather.body.append(Assign(acc, combine(op, acc, cast(
            BufLoad("red", linear(first + j + (1 + a * width)), size, False, dtype), acc.dtype))))
    wide.body.append(gather)
    out.append(wide)
    return out


def rewrite(stmts: list, fn: Callable[[Expr], Expr | None], rename: Callable[[str], str] | None = None) -> list:
    """``stmts`` rebuilt: every expression passed through :func:`~kiln.arith.expr.transform` with ``fn`` (which may
    replace a node; also inside buffer loads' indices and vector nodes, which ``transform`` alone does not enter),
    loop extents too, and every storage buffer a load reads or a store writes renamed by ``rename``.

    Raises:
        TypeError: a statement of a kind it does not know.
    """
    def hook(x: Expr) -> Expr | None:
        r = fn(x)
        if r is not None:
            return r
        if isinstance(x, BufLoad):
            size = transform(x.size, hook) if isinstance(x.size, Expr) else x.size  # (a guard's size: dims too)
            return BufLoad(rename(x.buf) if rename else x.buf, transform(x.index, hook),
                           int(size.value) if isinstance(size, Const) else size, x.guard, x.dtype)
        if isinstance(x, VecLoad):
            return VecLoad(x.buf, transform(x.index, hook), x.width, x.dtype)
        if isinstance(x, Lane):
            return Lane(transform(x.x, hook), x.lane, x.dtype)
        if isinstance(x, Vec):
            return Vec(tuple(transform(i, hook) for i in x.items), x.dtype)
        return None

    def expr(e):
        if not isinstance(e, Expr):
            return e
        e = transform(e, hook)
        return int(e.value) if isinstance(e, Const) and e.dtype == "int32" else e

    out: list = []
    for s in stmts:
        if isinstance(s, (Let, Decl, Assign)):
            out.append(type(s)(s.var, transform(s.value, hook)))
        elif isinstance(s, For):
            out.append(For(s.var, expr(s.extent), rewrite(s.body, fn, rename), s.lanes))
        elif isinstance(s, If):
            out.append(If(transform(s.cond, hook), rewrite(s.body, fn, rename)))
        elif isinstance(s, Store):
            out.append(Store(rename(s.buf) if rename else s.buf, transform(s.index, hook), transform(s.value, hook)))
        elif isinstance(s, Barrier):
            out.append(s)
        elif isinstance(s, Subgroups):
            out.append(Subgroups(rewrite(s.plain, fn, rename), rewrite(s.subgroup, fn, rename)))
        else:
            raise TypeError(f"cannot rewrite a {type(s).__name__} statement")
    return out


def pin_dims(k: LoweredKernel, values: dict[str, int]) -> LoweredKernel:
    """``k`` for run-time dims fixed at ``values`` (name -> value): each such :class:`~kiln.arith.expr.SizeVar` a
    constant, folded into the index arithmetic (a decode step's kernels at ``sequence`` 1 divide by constants, not
    by the dims uniform's words). Only for a kernel that never runs at other values of those dims (a plan step's
    alternative whose range pins them, :func:`kiln.codegen.webgpu.build.build_kernels`)."""
    def fn(x: Expr) -> Expr | None:
        return const(values[x.name], "int32") if isinstance(x, SizeVar) and x.name in values else None

    total = transform(k.total, fn) if isinstance(k.total, Expr) else k.total
    return replace(k, body=rewrite(k.body, fn), total=int(total.value) if isinstance(total, Const) else simplify(total))


def merge_arrays(into: dict[str, tuple[str, int]], arrays: dict[str, tuple[str, int]]) -> None:
    """Add workgroup arrays (name -> ``(dtype, elements)``) to ``into``, an array used twice keeping its larger size.

    Raises:
        ValueError: one array name with two dtypes.
    """
    for name, (dtype, size) in arrays.items():
        if name in into and into[name][0] != dtype:
            raise ValueError(f"workgroup array {name}: reductions of different dtypes meet in workgroup memory")
        into[name] = (dtype, max(size, into.get(name, (dtype, 0))[1]))


__all__ = ["Assign", "Barrier", "BufLoad", "Decl", "For", "If", "Lane", "Let", "LoweredKernel", "Param", "Store", "Subgroups", "Vec",
           "VecLoad", "accumulator_init", "combine", "combine_lanes", "lane_loop", "loop_iterations", "merge_arrays",
           "pin_dims", "prod", "ravel", "rewrite", "unravel"]
