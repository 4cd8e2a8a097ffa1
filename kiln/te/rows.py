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

Attention (:func:`kiln.passes.fusion.fuse_attention`) adds two things to that form. Its output is itself a
reduction over the row's keys, ``out[row, d] = sum_s P(row, s) * V[s, d]``, with a different value per column ``d``
(a *column reduction*); and each score ``S(row, s) = sum_e Q[row, e] K[s, e]`` is a reduction nested in the
reductions over ``s`` (the softmax's max and sum, the column reduction), which would recompute it in each. Such a
nested reduction, depending on the row and the enclosing reduction's axis only, is a *stage*: the lanes compute it
once for every key into a workgroup array (``st0[s]``), and every reduction then reads it there:

0. stages, each lane a strided share of the keys (a few at a time, their loads in flight together; or a group of
   lanes a key, each a strided share of its row, where the row's length allows), then a barrier; before them, the
   part of a stage's body that does not depend on the key (the query row, RoPE applied) is computed once into
   workgroup memory;
1. the row reductions as above (the softmax's max and sum over ``st0``); then the part of a column reduction's body
   that depends on no column (the probabilities) overwrites the stage, key by key;
2. the column reductions, each lane a tile of columns (neighbouring lanes, neighbouring columns) and a strided share
   of the keys, the shares summed through workgroup memory.

One workgroup a query row computes ``softmax(Q K^T) V`` with the scores never leaving the chip (the decode step of
FlashDecoding, Dao et al. 2023, with the row's scores whole in workgroup memory rather than an online softmax over
key blocks: a stage holds at most :data:`MAX_STAGE` keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.arith.expr import (
    Expr,
    Load,
    Reduce,
    Var,
    binop,
    call,
    cast,
    children,
    const,
    free_vars,
    linear,
    nodes,
    reduces_in,
    select,
    substitute,
    transform,
)
from kiln.arith.symbolic import at_opt, ceil_div, is_symbolic, simplify, upper
from kiln.te.compute import Tensor
from kiln.te.loops import (
    Assign,
    Barrier,
    BufLoad,
    Decl,
    For,
    If,
    Let,
    Store,
    accumulator_init,
    combine,
    combine_lanes,
    lane_loop,
    merge_arrays,
    ravel,
    rewrite,
    unravel,
)

#: most elements a row (reduction or output columns) may have for a row kernel (longer rows keep separate kernels)
MAX_ROW = 8192
#: most elements a stage (a workgroup array of a row's scores) may hold, at its run-time dims' upper bounds: with the
#: combining array, within WebGPU's default 16384 bytes of workgroup memory (maxComputeWorkgroupStorageSize)
MAX_STAGE = 2048
#: most rows (workgroups) a row kernel with column reductions may have, run-time dims at their ``opt`` (the value
#: kernels are scheduled for): each row reads all its keys and values, so many rows (an encoder's queries) read them
#: many times where tiled matmuls read them once a tile; a decode step's few query rows are what it is for. (A
#: decoder's one plan serves its prefill too, whose many rows then take this kernel: bench.llm's prefill rows.)
MAX_STAGED_ROWS = 256
#: most query rows times keys of a row kernel with column reductions over static shapes past MAX_STAGED_ROWS rows
#: (an encoder's attention at batch 1), a few rows a workgroup (kiln.te.schedule.ATTENTION_ROW_LANES lanes a row).
#: H200, MiniLM's attention (12 heads, 128 keys of 32 wide; bench/results/gpu-20261130-h200-session41.txt): 1536 rows
#: in one kernel 16 us a layer against 25 for the three kernels, 49152 rows (batch 32) 309 against 94: a row's own
#: reads of its keys cost about 6 ns a row against the three kernels' 2 ns and 20 us a layer, level near 4500 rows
MAX_STAGED_WORK = 1 << 19
#: values of the stage variable a lane computes a round (their loads in flight together)
STAGE_TILE = 4
#: lanes that share one stage value's reduction where its axis allows (:func:`_stage_shared`: neighbouring lanes read
#: neighbouring elements of a key's row, so that a warp's loads are coalesced), and the values such a group of lanes
#: computes a round
STAGE_LANES, STAGE_GROUP_TILE = 8, 4
#: terms of a column reduction a lane adds a round, and the columns it sums (:func:`_column_parts`)
KEY_TILE, COLUMN_TILE = 16, 4
#: most iterations of a stage's innermost reduction axis unrolled
UNROLL = 8
#: WebGPU's default maxComputeWorkgroupStorageSize: the workgroup memory a row kernel may declare
WORKGROUP_BYTES = 16384
#: most values of a stage's own reduction axis (a head's width) whose stage-invariant part is hoisted into workgroup
#: memory
MAX_HOISTED = 256


@dataclass
class RowPlan:
    """How a row kernel covers its output.

    Attributes:
        rows: positions of the output axes the reductions depend on (one workgroup per combination).
        cols: positions of the other output axes (the row's elements, shared among the lanes).
        levels: the row reductions, those nested in a reduction's body in an earlier level.
        stages: each stage's reduction over the stage variable (its axis ``0 <= sigma < extent``): computed once per
            value of ``sigma`` into workgroup array ``st<k>``.
        occurs: each occurrence of a stage in the expression (a reduction over the enclosing reduction's axis ``x``)
            -> ``(k, x)``, read as ``st<k>[x]``.
        columns: the column reductions (outermost, depending on column axes), computed per column after the levels.
        hoisted: ``(array, expression, axis, phase)``: a part of a stage's body that does not depend on the stage
            variable (phase ``pre``: the query row, RoPE applied, read once per key otherwise), or of a column
            reduction's body that depends on no column (phase ``post``: the softmax's probabilities, otherwise
            computed once per column), computed once per value of ``axis`` into workgroup array ``array`` (``post``
            parts overwrite the stage they read, value by value).
        bodies: the stages' and column reductions' bodies with the hoisted parts read from their arrays.
        sizes: each stage array's elements (:func:`_stage_size`).
    """

    rows: list[int]
    cols: list[int]
    levels: list[list[Reduce]]
    stages: list[tuple[Reduce, Var]] = field(default_factory=list)
    occurs: dict[Reduce, tuple[int, Var]] = field(default_factory=dict)
    columns: list[Reduce] = field(default_factory=list)
    hoisted: list[tuple[str, Expr, Var, str]] = field(default_factory=list)
    bodies: dict[Reduce, Expr] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)


def _at_upper(d) -> int:
    return int(upper(d)) if is_symbolic(d) else int(d)


def _stage_size(extent, bound: int | None) -> int:
    """The values a stage array holds: its extent's upper bound, or at most ``bound`` (a kernel the plan runs only
    for that many; ``stage_bound``)."""
    size = _at_upper(extent)
    return min(size, bound) if bound is not None and is_symbolic(extent) else size


def _stages(found: dict[Reduce, None], axes: set[Var], max_stage: int, bound: int | None) -> tuple[list, dict]:
    """The stages among ``found`` (see the module docstring): a reduction ``D`` with no reduction nested in it, directly
    in the body of a one-axis reduction over ``x``, that depends on ``x`` and otherwise on output ``axes`` only (the
    plan then checks they are row axes), of at most ``max_stage`` values of ``x`` (:func:`_stage_size`). Occurrences
    equal but for ``x`` (the softmax's max, its sum and the values' reduction each read the same scores) are one
    stage."""
    stages: list[tuple[Reduce, Var]] = []
    keys: dict[Reduce, int] = {}
    occurs: dict[Reduce, tuple[int, Var]] = {}
    for r in found:
        if len(r.axes) != 1 or _stage_size(r.axes[0].extent, bound) > max_stage:
            continue
        x = r.axes[0]
        for d in reduces_in(r.body, outermost=True):
            fv = free_vars(d.body)
            if reduces_in(d.body, outermost=True) or x not in fv or not fv - {x, *d.axes} <= axes:
                continue
            sigma = Var("sigma", x.extent)
            key = Reduce(d.op, substitute(d.body, {x: sigma}), d.axes, d.dtype)
            if key not in keys:
                keys[key] = len(stages)
                stages.append((key, sigma))
            occurs[d] = (keys[key], x)
    return stages, occurs


def analyse_rows(t: Tensor, max_row: int = MAX_ROW, max_stage: int = MAX_STAGE,
                 max_staged_rows: int | None = None) -> RowPlan | str:
    """The :class:`RowPlan` of computed tensor ``t`` (producers inlined), or why it has none (a string).

    ``t`` qualifies when it has reductions, each depends (besides its own axes) only on output axes
    (the row axes), at least one output axis of more than one element depends on none of them (the
    columns), and neither the reductions nor the row have more than ``max_row`` elements (run-time
    dims at their upper bound). With stages (nested reductions over an enclosing reduction's axis and the row axes, at
    most ``max_stage`` values of it; a run-time number of them counts at most ``t.attrs["stage_bound"]`` when a target
    runs the kernel only up to that many), the outermost reductions that read a stage may depend on the columns too
    (column reductions: attention's ``P V``), when there are at most ``max_staged_rows`` rows at ``opt`` (fusion's
    question, :data:`MAX_STAGED_ROWS`; a group fused so is a row kernel at every dim, its variants' included), and its
    workgroup arrays fit :data:`WORKGROUP_BYTES`.
    """
    found = dict.fromkeys(reduces_in(t.body))
    if not found:
        return "no reductions"
    axes = set(t.axes)
    bound = t.attrs.get("stage_bound")
    stages, occurs = _stages(found, axes, max_stage, bound)
    rest = {r: None for r in found if r not in occurs}
    # (an outermost reduction reading a stage is a column reduction where it depends on an output axis the stages do
    # not: attention's P V on V's columns; a block's max and sum beside it are row reductions, FlashDecoding's split)
    in_stages = set().union(*(free_vars(d.body) - {sigma, *d.axes} for d, sigma in stages))
    staged = [r for r in reduces_in(t.body, outermost=True)
              if r in rest and any(d in occurs for d in reduces_in(r.body, outermost=True))
              and free_vars(r.body) & axes - in_stages]
    plan = _row_plan(t, rest, axes, max_row, [])
    if isinstance(plan, str) and plan.startswith("no columns") and staged:
        plan = _row_plan(t, rest, axes, max_row, staged)
        if not isinstance(plan, str) and max_staged_rows is not None and \
                not _few_staged_rows(t, plan, stages, max_staged_rows):
            return f"more than {max_staged_rows} rows with column reductions"
    if isinstance(plan, str):
        return plan
    row_vars = {t.axes[a] for a in plan.rows}
    if any(not free_vars(d.body) - {sigma, *d.axes} <= row_vars for d, sigma in stages):
        return "a stage depends on a column"
    plan.stages, plan.occurs = stages, occurs
    plan.sizes = [_stage_size(sigma.extent, bound) for _, sigma in stages]
    _plan_hoists(plan, t)
    if plan.stages and workgroup_bytes(plan) > WORKGROUP_BYTES:
        return f"workgroup arrays of {workgroup_bytes(plan)} bytes (more than {WORKGROUP_BYTES})"
    return plan


def _few_staged_rows(t: Tensor, plan: RowPlan, stages: list[tuple[Reduce, Var]], max_staged_rows: int) -> bool:
    """Whether a row kernel with column reductions pays: at most ``max_staged_rows`` rows (run-time dims at
    ``opt``), or, over static shapes, rows times keys (the largest stage) at most :data:`MAX_STAGED_WORK`."""
    rows = _prod(at_opt(t.shape[a]) for a in plan.rows)
    if rows <= max_staged_rows:
        return True
    extents = [t.shape[a] for a in plan.rows] + [sigma.extent for _, sigma in stages]
    return not any(is_symbolic(e) for e in extents) and rows * max(int(sigma.extent) for _, sigma in stages) <= \
        MAX_STAGED_WORK


def workgroup_bytes(plan: RowPlan, lanes: int = 256, rows: int = 1) -> int:
    """The workgroup memory a row kernel of ``plan`` declares at ``lanes`` lanes a row and ``rows`` rows a workgroup,
    at most (4 bytes an element)."""
    pre = sum(int(ax.extent) for name, _, ax, phase in plan.hoisted if phase == "pre")
    red = max((len(level) for level in plan.levels), default=0) * lanes
    return 4 * rows * (sum(plan.sizes) + pre + red + len(plan.columns) * COLUMN_TILE * lanes)


def _group_tile(plan: RowPlan, lanes: int, rows: int = 1) -> int:
    """The values a group of :func:`_stage_shared`'s lanes computes a round: :data:`STAGE_GROUP_TILE`, halved until
    its partial sums (4 bytes a lane a value) fit in :data:`WORKGROUP_BYTES` beside the plan's other arrays (``rows``
    rows of ``lanes`` lanes a workgroup); 0 where none fit (the stages then take a lane a value)."""
    tile, base = STAGE_GROUP_TILE, workgroup_bytes(plan, lanes, rows)
    while tile and base + 4 * tile * lanes * rows > WORKGROUP_BYTES:
        tile //= 2
    return tile


def _summaries(e: Expr) -> dict[int, tuple[frozenset, bool]]:
    """Per node of ``e`` (by ``id``): the variables it mentions and whether it reads memory or reduces (worth computing
    once rather than per use), computed bottom-up once."""
    memo: dict[int, tuple[frozenset, bool]] = {}
    todo: list[tuple[Expr, bool]] = [(e, False)]
    while todo:  # (post-order: a node once its children are done)
        x, ready = todo.pop()
        if id(x) in memo:
            continue
        if not ready:
            todo.append((x, True))
            todo += [(k, False) for k in children(x) if id(k) not in memo]
            continue
        ks = children(x)
        fv = frozenset({x} if isinstance(x, Var) else ()).union(*(memo[id(k)][0] for k in ks))
        memo[id(x)] = (fv, isinstance(x, (Load, Reduce)) or any(memo[id(k)][1] for k in ks))
    return memo


def _invariant(e: Expr, bad: set[Var], ax: Var) -> list[Expr]:
    """The largest subexpressions of ``e`` (not inside a load's indices or a reduction) that depend on ``ax`` but on
    none of ``bad`` and read memory."""
    out: dict[Expr, None] = {}
    info = _summaries(e)

    def go(x: Expr) -> None:
        fv, reads = info[id(x)]
        if not fv & bad and ax in fv and reads:
            out.setdefault(x, None)
        else:
            for k in children(x, into_reduce=False, into_load=False):
                go(k)

    go(e)
    return list(out)


def _replace(e: Expr, parts: dict[Expr, Expr]) -> Expr:
    return transform(e, lambda x: parts.get(x))


def _plan_hoists(plan: RowPlan, t: Tensor) -> None:
    """Fill ``plan.hoisted`` and ``plan.bodies`` (see :class:`RowPlan`): ``pre`` parts of one-axis stages whose axis is
    static and at most :data:`MAX_HOISTED`, ``post`` parts of one-axis column reductions when there is one stage and
    one such reduction, which overwrite the stage (its every read is then inside the part)."""
    for k, (d, sigma) in enumerate(plan.stages):
        if len(d.axes) != 1 or is_symbolic(d.axes[0].extent) or d.axes[0].extent > MAX_HOISTED:
            continue
        e = d.axes[0]
        parts = {}
        for j, h in enumerate(_invariant(d.body, {sigma}, e)):
            name = f"sq{k}_{j}"
            plan.hoisted.append((name, h, e, "pre"))
            parts[h] = BufLoad(name, e, int(e.extent), False, h.dtype)
        plan.bodies[d] = _replace(d.body, parts)
    cols = {t.axes[a] for a in plan.cols}
    if len(plan.stages) != 1 or len(plan.columns) != 1 or len(plan.columns[0].axes) != 1:
        return
    r = plan.columns[0]
    s_ax = r.axes[0]
    found = _invariant(r.body, cols, s_ax)
    if len(found) != 1:
        return
    h = found[0]
    mine = [x for x in plan.occurs if plan.occurs[x] == (0, s_ax)]
    body = _replace(r.body, {h: BufLoad("st0", s_ax, plan.sizes[0], False, h.dtype)})
    if any(x in reduces_in(body) for x in plan.occurs) or not any(x in reduces_in(h) for x in mine):
        return
    plan.hoisted.append(("st0", h, s_ax, "post"))
    plan.bodies[r] = body


def _row_plan(t: Tensor, found: dict[Reduce, None], axes: set[Var], max_row: int, columns: list[Reduce]) \
        -> RowPlan | str:
    """:func:`analyse_rows` for reductions ``found`` (stages left out), ``columns`` of them column reductions."""
    level: dict[Reduce, int] = {}

    def level_of(r: Reduce) -> int:
        if r not in level:
            inner = [i for i in reduces_in(r.body, outermost=True) if i in found]
            level[r] = 1 + max((level_of(i) for i in inner), default=0)
        return level[r]

    row_vars: set[Var] = set()
    col_vars: set[Var] = set()
    for r in found:
        nested = _nested(r)
        own = set().union(*(free_vars(i) for i in nested)) if nested else set()
        free = free_vars(r.body) - set(r.axes) - own
        if not free <= axes:
            return "a reduction depends on another reduction's axis"
        (col_vars if r in columns else row_vars).update(free)
        size = 1
        for ax in r.axes:
            size *= _at_upper(ax.extent)
        if size > max_row:
            return f"a reduction of {size} elements (more than {max_row})"
        if r not in columns:
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
    depth = max(level.values(), default=0)
    levels = [[r for r in found if r not in columns and level[r] == k] for k in range(1, depth + 1)]
    return RowPlan(rows, cols, levels, columns=list(columns))


def _nested(r: Reduce) -> list[Var]:
    """The axes of the reductions nested in ``r``'s body (bound there, not free)."""
    return [a for x in nodes(r.body) if isinstance(x, Reduce) and x is not r for a in x.axes]


def lower_rows(out: Tensor, plan: RowPlan, lanes: int, flat, cse, counter, width: int | None = None):
    """Statements of the row kernel of ``out`` (canonical, producers inlined) under ``plan``, ``lanes``
    invocations a row (a power of two): the hoisted ``pre`` parts and the stages, the levels of row reductions,
    the ``post`` parts, then the columns (with column reductions, :func:`_column_parts`).

    A workgroup of ``width`` invocations (a multiple of ``lanes``; ``lanes`` where not given) computes ``width /
    lanes`` neighbouring rows, each with its ``lanes`` neighbouring invocations and its own part of every workgroup
    array (:func:`_per_row`): the rows of an encoder's attention that share a head's keys and values then read them
    on one core, from its cache.

    ``flat(e, guarded)`` flattens an expression over buffer loads and ``cse(values, block)`` binds
    shared loads (both from :func:`kiln.te.lower.lower`). Returns ``(body, total rows, shared arrays)``.
    """

    lid, wid, lane, tile, gid = Var("lid"), Var("wid"), Var("lane"), Var("tile"), Var("gid")
    width = width or lanes
    per = width // lanes  # rows a workgroup
    row_shape = [out.shape[a] for a in plan.rows]
    col_shape = [out.shape[a] for a in plan.cols]
    total = simplify(_prod(row_shape))
    # out-of-range workgroups (a dispatch wrapped into y) compute a clamped row and store nothing
    sub = Var("rsub")
    first = [Let(lane, lid), Let(tile, wid)] if per == 1 else \
        [Let(lane, lid % lanes), Let(sub, lid // lanes), Let(tile, wid * per + sub)]
    body: list = [*first, Let(gid, call("min", tile, total - 1))]
    body += unravel(gid, [out.axes[a] for a in plan.rows], row_shape, total)
    accs: dict[Reduce, Var] = {}
    shared: dict[str, tuple[str, int]] = {}
    sizes = plan.sizes

    def known(e: Expr) -> Expr:
        def fn(x):
            if not isinstance(x, Reduce):
                return None
            if x in accs:
                return accs[x]
            if x in plan.occurs:  # a stage's value at the enclosing reduction's axis, from workgroup memory
                k, ax = plan.occurs[x]
                return BufLoad(f"st{k}", ax, sizes[k], False, plan.stages[k][0].dtype)
            return None
        return transform(e, fn)

    pre = [h for h in plan.hoisted if h[3] == "pre"]
    for name, h, ax, _ in pre:  # the stages' parts that do not depend on the stage variable, once
        shared[name] = (h.dtype, int(ax.extent))
        loop, inner = lane_loop(ax, lanes, lane, f"{ax.name}h{next(counter)}")
        body.append(loop)
        inner.append(Store(name, ax, cse([flat(h, False)], inner)[0]))
    if pre:
        body.append(Barrier())
    group_tile = _group_tile(plan, lanes, per)
    for k, (d, sigma) in enumerate(plan.stages):
        shared[f"st{k}"] = (d.dtype, sizes[k])
        if _stage_lanes(d, lanes, group_tile):
            _stage_shared(d, plan.bodies.get(d, d.body), sigma, f"st{k}", lanes, group_tile, body, shared, flat, cse,
                          counter)
        else:
            _stage(d, plan.bodies.get(d, d.body), sigma, f"st{k}", lanes, body, flat, cse, counter)
    if plan.stages:
        body.append(Barrier())  # every stage is whole before any reduction reads it

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
        merge_arrays(shared, combine_lanes([(acc, r.op) for r, acc in made], lanes, width, body))
        accs.update(made)
    post = [h for h in plan.hoisted if h[3] == "post"]
    for name, h, ax, _ in post:  # the column reductions' parts that depend on no column, once (over their stage)
        loop, inner = lane_loop(ax, lanes, lane, f"{ax.name}h{next(counter)}")
        body.append(loop)
        inner.append(Store(name, ax, cse([flat(known(h), False)], inner)[0]))
        body.append(Barrier())
    ncols = simplify(_prod(col_shape))
    if plan.columns and not is_symbolic(ncols) and ncols <= lanes:
        _column_parts(out, plan, lanes, ncols, body, shared, accs, known, flat, cse, counter, total)
        return _per_row(body, shared, per, sub), total, shared
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
    for r in plan.columns:  # each lane sums its column's reductions alone
        acc = Var(f"acc{next(counter)}", 0, r.dtype)
        store_block.body.append(Decl(acc, accumulator_init(r)))
        inner = store_block.body
        for ax in r.axes:
            nest = For(ax, ax.extent)
            inner.append(nest)
            inner = nest.body
        inner.append(Assign(acc, cse([flat(combine(r.op, acc, known(plan.bodies.get(r, r.body))), False)], inner)[0]))
        accs[r] = acc
    value = cse([flat(known(out.body), False)], store_block.body)[0]
    store_block.body.append(Store("out", linear(ravel(list(out.axes), out.shape)), value))
    return _per_row(body, shared, per, sub), total, shared


def _per_row(body: list, shared: dict[str, tuple[str, int]], per: int, sub: Var) -> list:
    """``body`` with each of ``per`` rows a workgroup (row ``sub`` of them) in its own part of every workgroup array
    but ``red`` (:func:`~kiln.te.loops.combine_lanes` places each group of lanes there itself): element ``i`` of an
    array of ``n`` a row at ``sub * n + i``; ``shared``'s sizes grow to ``per`` times theirs. ``body`` as it is for
    one row a workgroup."""
    if per == 1:
        return body
    sizes = {name: n for name, (_, n) in shared.items() if name != "red"}
    for name, n in sizes.items():
        shared[name] = (shared[name][0], n * per)

    def load(x: Expr) -> Expr | None:
        if isinstance(x, BufLoad) and x.buf in sizes:
            return BufLoad(x.buf, linear(sub * sizes[x.buf] + transform(x.index, load)), sizes[x.buf] * per,
                           x.guard, x.dtype)
        return None

    def stores(stmts: list) -> list:
        for s in stmts:
            if isinstance(s, Store) and s.buf in sizes:
                s.index = linear(sub * sizes[s.buf] + s.index)
            for inner in (getattr(s, "body", None), getattr(s, "plain", None), getattr(s, "subgroup", None)):
                if isinstance(inner, list):
                    stores(inner)
        return stmts

    return stores(rewrite(body, load))


def _subst(e: Expr, mapping: dict) -> Expr:
    """``substitute`` that also rewrites the indices of workgroup-array loads (:class:`BufLoad`)."""
    def fn(x):
        if isinstance(x, Var):
            return mapping.get(x)
        if isinstance(x, BufLoad):
            return BufLoad(x.buf, linear(_subst(x.index, mapping)), x.size, x.guard, x.dtype)
        return None
    return transform(e, fn)


def _unroll(extent) -> int:
    """The largest divisor of static ``extent`` up to :data:`UNROLL` (1 for a run-time one)."""
    if is_symbolic(extent):
        return 1
    return max(f for f in range(1, UNROLL + 1) if extent % f == 0)


def _tiled_lane_loop(ax: Var, step: int, start: Expr, tile: int, block: list, counter) -> tuple[For, list]:
    """A loop dealing ``tile`` values of axis ``ax`` a round to each lane (value ``(round * tile + j) * step +
    start``; fewer where the axis has fewer values for a lane), for the loads of a round to be in flight together.
    Returns the loop and per value ``j`` its index clamped into the axis (safe to load), whether it is in range, and
    the index itself."""
    tile = max(1, min(tile, -(-_at_upper(ax.extent) // step)))  # (no more values a round than a lane ever gets)
    steps = ceil_div(ax.extent, step * tile)
    loop = For(Var(f"{ax.name}t{next(counter)}", steps), steps)
    block.append(loop)
    out = []
    for j in range(tile):
        idx, at = Var(f"{ax.name}i{next(counter)}"), Var(f"{ax.name}c{next(counter)}")
        loop.body += [Let(idx, (loop.var * tile + j) * step + start),
                      Let(at, call("max", call("min", idx, ax.extent - 1), 0))]
        out.append((at, binop("<", idx, ax.extent), idx))
    return loop, out


def _stage(d: Reduce, d_body: Expr, sigma: Var, name: str, lanes: int, body: list, flat, cse, counter) -> None:
    """Statements filling stage array ``name``: each lane computes :data:`STAGE_TILE` values of the stage variable a
    round, its reduction's axis unrolled, so that a round's loads are in flight together (a decode step has few
    rows, hence few workgroups: latency, not bandwidth, bounds it)."""
    loop, values = _tiled_lane_loop(sigma, lanes, Var("lane"), STAGE_TILE, body, counter)
    accs = [Var(f"acc{next(counter)}", 0, d.dtype) for _ in values]
    loop.body += [Decl(a, accumulator_init(d)) for a in accs]
    block = loop.body
    for ax in d.axes[:-1]:
        nest = For(ax, ax.extent)
        block.append(nest)
        block = nest.body
    last = d.axes[-1]
    f = _unroll(last.extent)
    outer = Var(f"{last.name}o{next(counter)}", simplify(last.extent // f) if f > 1 else last.extent)
    nest = For(outer, outer.extent)
    block.append(nest)
    updates = []
    for c in range(f):
        for (at, _, _), acc in zip(values, accs):
            v = _subst(d_body, {sigma: at, last: outer * f + c if f > 1 else outer})
            updates.append((acc, flat(combine(d.op, acc, v), False)))
    # each accumulator's updates in order (the first's result feeds the next): one assignment per update
    for (acc, _), v in zip(updates, cse([u for _, u in updates], nest.body)):
        nest.body.append(Assign(acc, v))
    for (_, ok, idx), acc in zip(values, accs):
        loop.body.append(If(ok, [Store(name, idx, acc)]))


def _stage_lanes(d: Reduce, lanes: int, tile: int) -> int:
    """The lanes that share each value of stage ``d`` (:data:`STAGE_LANES`), or 0 where :func:`_stage_shared` does
    not apply: ``d`` reduces more than one axis or one of run-time extent, or one not a multiple of them, or its
    partial sums do not fit (``tile`` 0, :func:`_group_tile`)."""
    if not tile or len(d.axes) != 1 or is_symbolic(d.axes[0].extent):
        return 0
    extent, g = int(d.axes[0].extent), STAGE_LANES
    # (a round's values are added by lanes below (lanes / g) * tile: there must be that many)
    return g if extent % g == 0 and lanes % g == 0 and tile <= g else 0


def _stage_shared(d: Reduce, d_body: Expr, sigma: Var, name: str, lanes: int, tile: int, body: list, shared: dict,
                  flat, cse, counter) -> None:
    """Statements filling stage array ``name`` with :data:`STAGE_LANES` (``G``) lanes a value: lane ``g + G * q`` sums
    the terms ``g, g + G, ...`` of the reduction for ``tile`` values of the stage variable a round (``q`` the lane's
    slot: its values are the round's ``q``-th, ``q + lanes / G``-th, ...), so neighbouring lanes read neighbouring
    elements of one key's row (a warp's loads
    coalesced, where a lane a key reads 32 rows at once); the partial sums meet in workgroup array ``stp`` and one
    lane a value adds them. Two barriers a round. (FlashDecoding's split of a query's dot products over a warp, Dao
    et al. 2023.) On an H100, SmolLM2's decode attention took 11 us a layer at 128 keys this way against 16-18 with a
    lane a key, and 28 against 55 at 1024 (with the column reductions' loads coalesced too;
    bench/results/llm-attention-20261127-h100.txt)."""
    g = STAGE_LANES
    groups = lanes // g  # values a round per tile slot
    lane, ax = Var("lane"), d.axes[0]
    part, slot = Var(f"sg{next(counter)}"), Var(f"sq{next(counter)}")
    body += [Let(part, lane % g), Let(slot, lane // g)]
    loop, values = _tiled_lane_loop(sigma, groups, slot, tile, body, counter)
    tile = len(values)  # (fewer where the stage has fewer values)
    accs = [(at, Var(f"acc{next(counter)}", 0, d.dtype)) for at, _, _ in values]
    loop.body += [Decl(acc, accumulator_init(d)) for _, acc in accs]
    terms = int(ax.extent) // g
    f = _unroll(terms)
    outer = Var(f"{ax.name}o{next(counter)}", terms // f)
    nest = For(outer, outer.extent)
    loop.body.append(nest)
    updates = []
    for c in range(f):
        for at, acc in accs:
            v = _subst(d_body, {sigma: at, ax: (outer * f + c) * g + part})
            updates.append((acc, flat(combine(d.op, acc, v), False)))
    for (acc, _), v in zip(updates, cse([u for _, u in updates], nest.body)):
        nest.body.append(Assign(acc, v))
    size = tile * lanes
    merge_arrays(shared, {"stp": (d.dtype, size)})
    for j, (_, acc) in enumerate(accs):
        loop.body.append(Store("stp", linear(lane + j * lanes), acc))
    loop.body.append(Barrier())
    done = If(binop("<", lane, groups * tile))
    j_var, q_var, key = Var(f"sj{next(counter)}"), Var(f"sk{next(counter)}"), Var(f"{sigma.name}k{next(counter)}")
    done.body += [Let(j_var, lane // groups), Let(q_var, lane % groups),
                  Let(key, (loop.var * tile + j_var) * groups + q_var)]
    total: Expr = BufLoad("stp", linear(j_var * lanes + q_var * g), size, False, d.dtype)
    for x in range(1, g):
        total = combine(d.op, total, BufLoad("stp", linear(j_var * lanes + q_var * g + x), size, False, d.dtype))
    done.body.append(If(binop("<", key, sigma.extent), [Store(name, key, total)]))
    loop.body += [done, Barrier()]  # (the next round overwrites stp)


def _column_parts(out: Tensor, plan: RowPlan, lanes: int, ncols: int, body: list, shared: dict,
                  accs: dict, known, flat, cse, counter, total) -> None:
    """The column reductions of a row kernel, each lane a tile of ``w`` columns ``groups`` apart (``w`` from
    :data:`COLUMN_TILE` down, dividing ``ncols``; neighbouring lanes take neighbouring columns, so that a warp's loads
    of a key's row are coalesced) and ``parts`` lanes a tile: lane ``g + p * groups`` sums
    every ``parts``-th term of its tile's columns from ``p`` on, :data:`KEY_TILE` terms a round with their loads in
    flight together, the parts meet in workgroup array ``redc`` and part 0 stores the tile. A last column of row
    values only (:func:`_row_only_tail`) is left out of the tiles and stored by one lane."""
    lane, tile = Var("lane"), Var("tile")
    tail = _row_only_tail(out, plan, ncols)
    ncols -= tail  # (the columns the lanes tile: a split's P V, 64 columns, its log-sum-exp stored apart)
    w = COLUMN_TILE
    while ncols % w:
        w //= 2
    groups = ncols // w
    parts = max(1, lanes // groups)
    g, part = Var(f"g{next(counter)}"), Var(f"part{next(counter)}")
    body += [Let(g, lane % groups), Let(part, lane // groups)]
    col_axes = [out.axes[a] for a in plan.cols]
    cols = []  # per column of the tile: its axis values
    for t in range(w):
        cv = Var(f"c{next(counter)}")
        body.append(Let(cv, g + t * groups))  # (columns ``groups`` apart: a warp's loads of a key's row coalesce)
        lets = unravel(cv, [Var(f"{a.name}_{t}_{next(counter)}") for a in col_axes],
                       [out.shape[a] for a in plan.cols], ncols)
        body += lets
        cols.append({a: let.var for a, let in zip(col_axes, lets)})
    active = If(binop("<", part, parts))
    made = []
    for r in plan.columns:
        r_body = plan.bodies.get(r, r.body)
        tile_accs = [Var(f"acc{next(counter)}", 0, r.dtype) for _ in range(w)]
        body += [Decl(a, accumulator_init(r)) for a in tile_accs]
        if len(r.axes) == 1:
            loop, values = _tiled_lane_loop(r.axes[0], parts, part, KEY_TILE, active.body, counter)
            updates = [(acc, flat(combine(r.op, acc, select(ok, _subst(known(r_body), {r.axes[0]: at, **col}),
                                                            accumulator_init(r))), False))
                       for at, ok, _ in values for acc, col in zip(tile_accs, cols)]
            block = loop.body
        else:
            loop, block = lane_loop(r.axes[0], parts, part, f"{r.axes[0].name}s{next(counter)}")
            active.body.append(loop)
            for ax in r.axes[1:]:
                nest = For(ax, ax.extent)
                block.append(nest)
                block = nest.body
            updates = [(acc, flat(combine(r.op, acc, _subst(known(r_body), col)), False))
                       for acc, col in zip(tile_accs, cols)]
        for (acc, _), v in zip(updates, cse([u for _, u in updates], block)):
            block.append(Assign(acc, v))
        made.append((r, tile_accs))
    body.append(active)
    dtypes = {r.dtype for r in plan.columns}
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    size = len(made) * w * lanes
    shared["redc"] = (dtype, size)
    for a, (_, tile_accs) in enumerate(made):
        for t, acc in enumerate(tile_accs):
            body.append(Store("redc", linear(lane + (a * w + t) * lanes), cast(acc, dtype)))
    body.append(Barrier())
    done = If(binop("==", part, 0) & binop("<", tile, total))
    for t in range(w):
        for a, (r, tile_accs) in enumerate(made):
            at = (a * w + t) * lanes
            sum_ = BufLoad("redc", linear(g + at), size, False, dtype)
            for p in range(1, parts):
                sum_ = combine(r.op, sum_, BufLoad("redc", linear(g + (at + p * groups)), size, False, dtype))
            done.body.append(Assign(tile_accs[t], cast(sum_, r.dtype)))
            accs[r] = tile_accs[t]
        value = cse([flat(_subst(known(out.body), cols[t]), False)], done.body)[0]
        index = _subst(ravel(list(out.axes), out.shape), cols[t])
        done.body.append(Store("out", linear(index), value))
    body.append(done)
    if tail:  # the last column, of row values only: one lane stores it
        last = If(binop("==", lane, 0) & binop("<", tile, total))
        at = _column_at([out.axes[a] for a in plan.cols], ncols)
        value = cse([flat(_subst(known(out.body), at), False)], last.body)[0]
        last.body.append(Store("out", linear(_subst(ravel(list(out.axes), out.shape), at)), value))
        body.append(last)


def _row_only_tail(out: Tensor, plan: RowPlan, ncols: int) -> int:
    """1 where the last column of ``out`` (its column axes of one value each but the innermost) reads no column
    reduction (FlashDecoding's split kernel, :mod:`kiln.passes.split_attention`, packs its log-sum-exp there, after
    ``P V``) and the others are a power of two, else 0: the lanes then tile the others, one lane stores it.
    SmolLM2's 65 columns had made 3 parts of lanes 65 apart, whose warps read two keys' rows; now 16 parts of 4
    columns. H200, SmolLM2's decode step at 1024 keys, queued, median of 9 interleaved rounds: 1.268 ms before,
    1.231 after (bench/results/llm-split-20261129-h200.txt)."""
    axes = [out.axes[a] for a in plan.cols]
    if ncols < 3 or (ncols - 1) & (ncols - 2) or any(out.shape[a] != 1 for a in plan.cols[:-1]):
        return 0
    columns, marker = set(plan.columns), "kiln_column_reduction"
    e = transform(out.body, lambda x: Var(marker, 0, x.dtype) if x in columns else None)  # (of its dtype: fp16
    # compute compares it with float bounds)
    last = substitute(e, _column_at(axes, ncols - 1))
    return int(not any(isinstance(x, Var) and x.name == marker for x in nodes(last)))


def _column_at(axes: list[Var], c: int) -> dict[Var, Expr]:
    """Column axes ``axes`` (all of one value but the last) at column ``c``."""
    return {**{a: const(0, "int32") for a in axes[:-1]}, axes[-1]: const(c, "int32")}


def _prod(dims):
    n = 1
    for d in dims:
        n = n * d
    return n
